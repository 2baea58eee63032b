"""The task's code from a real git repository: a commit plus a diff, through the cached mirror."""

from __future__ import annotations

import sys

from helpers.runner import (
    commit_files,
    console,
    diff_of,
    make_job,
    make_repo,
    read_json,
    run_runner,
)

PY = sys.executable


def _code(repo, commit, diff="", subdir=""):
    return {"repo": str(repo), "commit": commit, "diff": diff, "workdir": None, "subdir": subdir}


def test_code_at_a_commit_plus_a_diff_runs_the_changed_code(tmp_path):
    repo, first = make_repo(tmp_path, {"app/main.py": "print('committed')\n", "README": "x\n"})
    diff = diff_of(repo, {"app/main.py": "print('changed by the diff')\n"})
    commit_files(repo, {"app/main.py": "print('a later commit')\n"})  # the task asks for `first`
    job = make_job(tmp_path, command=[PY, "main.py"], code=_code(repo, first, diff, "app"))
    result = run_runner(job)
    assert result.returncode == 0, console(job)
    assert console(job).splitlines()[-1] == "changed by the diff"
    assert read_json(job, "exit.json")["outcome"] == "completed"


def test_a_diff_that_does_not_apply_fails_naming_the_file(tmp_path):
    repo, first = make_repo(tmp_path, {"main.py": "print('one')\n", "other.py": "x = 1\n"})
    diff = diff_of(repo, {"main.py": "print('two')\n"})
    second = commit_files(repo, {"main.py": "print('something else')\n"})
    job = make_job(tmp_path, command=[PY, "main.py"], code=_code(repo, second, diff))
    result = run_runner(job)
    assert result.returncode == 125
    exit_file = read_json(job, "exit.json")
    assert exit_file["outcome"] == "setup_failed"
    assert exit_file["reason"] == f"the diff does not apply to {second[:12]}: main.py"


def test_a_diff_for_a_missing_file_names_it(tmp_path):
    repo, first = make_repo(tmp_path, {"main.py": "print('one')\n"})
    diff = "--- a/gone.py\n+++ b/gone.py\n@@ -1 +1 @@\n-a\n+b\n"
    job = make_job(tmp_path, command=[PY, "main.py"], code=_code(repo, first, diff))
    run_runner(job)
    assert read_json(job, "exit.json")["reason"].endswith(": gone.py")


def test_the_mirror_is_cloned_once_then_reused_then_fetched(tmp_path):
    repo, first = make_repo(tmp_path, {"main.py": "print('one')\n"})
    runs = []
    for name, commit in (("a", first), ("b", first), ("c", None)):
        if commit is None:
            commit = commit_files(repo, {"main.py": "print('two')\n"})
        job = make_job(tmp_path, name, command=[PY, "main.py"], code=_code(repo, commit))
        assert run_runner(job).returncode == 0, console(job)
        runs.append(console(job))
    assert "(mirror cloned)" in runs[0]
    assert "(mirror cached)" in runs[1]
    assert "(mirror fetched)" in runs[2] and runs[2].endswith("two\n")


def test_an_unknown_commit_is_setup_failed(tmp_path):
    repo, _ = make_repo(tmp_path, {"main.py": "print('one')\n"})
    job = make_job(tmp_path, command=[PY, "main.py"], code=_code(repo, "0" * 40))
    assert run_runner(job).returncode == 125
    assert read_json(job, "exit.json")["reason"] == f"commit {'0' * 40} not found in {repo}"


def test_a_subdir_outside_the_repository_is_refused(tmp_path):
    repo, first = make_repo(tmp_path, {"main.py": "print('one')\n"})
    job = make_job(tmp_path, command=["pwd"], code=_code(repo, first, subdir="../.."))
    run_runner(job)
    assert "leaves the repository" in read_json(job, "exit.json")["reason"]
