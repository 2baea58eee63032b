"""Task environments with real uv, pip and PyPI: built once per key, reused, kept while in use."""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import wait_for
from helpers.runner import (
    UV,
    cache_of,
    console,
    make_job,
    read_json,
    run_runner,
    start_runner,
)

from inside_job import envcache

IMPORT_SIX = "import six, sys; print('six', six.__version__, sys.prefix != sys.base_prefix)"


def _state(job):
    try:
        return read_json(job, "status.json")["state"]
    except (OSError, ValueError):
        return None


@pytest.fixture(scope="module")
def package_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("package-cache"))


def _env_job(tmp_path, package_cache, name="job", command=None, **task):
    task.setdefault("requirements", ["six==1.16.0"])
    task.setdefault("uv", UV)
    return make_job(
        tmp_path,
        name,
        command=command or ["python", "-c", IMPORT_SIX],
        package_cache=package_cache,
        **task,
    )


def test_a_task_with_requirements_runs_with_them_and_a_second_reuses(tmp_path, package_cache):
    first = _env_job(tmp_path, package_cache, "first")
    assert run_runner(first).returncode == 0, console(first)
    assert console(first).endswith("six 1.16.0 True\n")
    built = read_json(first, "exit.json")["environment"]
    assert built["reused"] is False and built["tool"] == "uv"
    assert "klique: building environment" in console(first)

    second = _env_job(tmp_path, package_cache, "second")
    assert run_runner(second).returncode == 0, console(second)
    reused = read_json(second, "exit.json")["environment"]
    assert reused["reused"] is True and reused["key"] == built["key"]
    assert f"klique: reusing environment {built['key'][:12]}" in console(second)
    assert "building" not in console(second)


HOLD = "import os, time\nwhile not os.path.exists('../release'): time.sleep(0.01)\nprint('ok')\n"


def test_four_concurrent_runners_build_one_environment(tmp_path, package_cache):
    # Every task stays running until all four have started: none waits for another's task.
    jobs = [
        _env_job(
            tmp_path,
            package_cache,
            f"job{i}",
            requirements=["six==1.15.0"],
            command=["python", "-c", HOLD],
        )
        for i in range(4)
    ]
    runners = [start_runner(job) for job in jobs]
    for job in jobs:
        wait_for(lambda job=job: _state(job) == "running", timeout=120, what=f"{job.name} to run")
    (tmp_path / "release").touch()
    assert [r.wait(60) for r in runners] == [0, 0, 0, 0]
    reports = [read_json(job, "exit.json")["environment"] for job in jobs]
    assert sorted(r["reused"] for r in reports) == [False, True, True, True]
    assert len({r["key"] for r in reports}) == 1
    envs = cache_of(tmp_path) / "envs"
    assert [p.name for p in envs.iterdir() if not p.name.endswith(".lock")] == [reports[0]["key"]]


def test_without_uv_the_environment_is_built_with_venv_and_pip(tmp_path, package_cache):
    job = _env_job(
        tmp_path,
        package_cache,
        uv=None,
        command=["python", "-c", IMPORT_SIX + "; import subprocess"],
    )
    result = run_runner(job, PATH="/usr/bin:/bin")  # no uv on this PATH
    assert result.returncode == 0, console(job)
    assert read_json(job, "exit.json")["environment"]["tool"] == "pip"
    assert console(job).endswith("six 1.16.0 True\n")


def test_requirements_from_the_projects_file(tmp_path, package_cache):
    work = tmp_path / "work"
    work.mkdir()
    (work / "pyproject.toml").write_text(
        '[project]\nname = "demo"\nversion = "0"\ndependencies = ["six==1.16.0"]\n'
    )
    job = _env_job(
        tmp_path,
        package_cache,
        requirements=None,
        requirements_file="pyproject.toml",
        code={"workdir": str(work)},
    )
    assert run_runner(job).returncode == 0, console(job)
    assert console(job).endswith("six 1.16.0 True\n")


def test_requirements_from_a_uv_lock(tmp_path, package_cache):
    work = tmp_path / "work"
    work.mkdir()
    (work / "pyproject.toml").write_text(
        '[project]\nname = "demo"\nversion = "0"\nrequires-python = ">=3.8"\n'
        'dependencies = ["six==1.16.0"]\n'
    )
    locked = subprocess.run(
        [UV, "lock", "--quiet"],
        cwd=work,
        capture_output=True,
        text=True,
        env=dict(os.environ, UV_CACHE_DIR=package_cache),
        check=False,
    )
    assert locked.returncode == 0, locked.stderr
    job = _env_job(
        tmp_path,
        package_cache,
        requirements=None,
        requirements_file="uv.lock",
        code={"workdir": str(work)},
    )
    assert run_runner(job).returncode == 0, console(job)
    assert console(job).endswith("six 1.16.0 True\n")
    assert "(1 package)" in console(job)


def test_eviction_never_removes_an_environment_in_use(tmp_path, package_cache):
    hold = (
        "import os, time\nprint('ready', flush=True)\n"
        "while not os.path.exists('release'): time.sleep(0.01)\n"
    )
    job = _env_job(tmp_path, package_cache, command=["python", "-c", hold])
    runner = start_runner(job)
    wait_for(lambda: "ready" in console(job), timeout=120, what="the task to start")
    envs = str(cache_of(tmp_path) / "envs")
    key = [name for name in os.listdir(envs) if not name.endswith(".lock")][0]
    assert envcache.evict(envs, budget=0) == []  # in use: kept
    assert os.path.isdir(os.path.join(envs, key))
    (job / "release").touch()
    assert runner.wait(60) == 0
    # No longer in use once the background byte-compile (which holds it too) has finished.
    wait_for(lambda: envcache.evict(envs, budget=0) == [key], timeout=60, what="eviction")
    assert not os.path.exists(os.path.join(envs, key))


def _compiled(job):
    key = read_json(job, "exit.json")["environment"]["key"]
    env = cache_of(job.parent) / "envs" / key
    return list(env.glob("lib/python*/site-packages/__pycache__/six.*.pyc"))


def test_an_environment_is_byte_compiled_before_use_when_asked(tmp_path, package_cache):
    job = _env_job(tmp_path, package_cache, command=["true"], compile="build")
    assert run_runner(job).returncode == 0, console(job)
    assert _compiled(job)  # the task never imported six


def test_an_environment_is_byte_compiled_in_the_background_by_default(tmp_path, package_cache):
    job = _env_job(tmp_path, package_cache, command=["true"])
    assert run_runner(job).returncode == 0, console(job)
    wait_for(lambda: _compiled(job), timeout=60, what="the background byte-compile")


def test_a_requirement_that_cannot_be_installed_is_setup_failed(tmp_path, package_cache):
    job = _env_job(tmp_path, package_cache, requirements=["six==0.0.0.0"])
    assert run_runner(job).returncode == 125
    exit_file = read_json(job, "exit.json")
    assert exit_file["outcome"] == "setup_failed"
    assert exit_file["reason"].startswith("installing the requirements with uv failed")
    envs = cache_of(tmp_path) / "envs"
    assert [p.name for p in envs.iterdir() if not p.name.endswith(".lock")] == []
