"""The runner as the broker ships it: klique-runner.pyz in the job directory, on any python3.8+."""

from __future__ import annotations

import glob
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.runner import REPO_ROOT, console, make_job, read_json, runner_env

from broker.estate import load_estate
from broker.preview import render_preview, sample_task
from inside_job import zipapp

SCALAR_TASK = (
    "from inside_job import report\n"
    "report.scalar('loss', 0.5, step=1)\n"
    "report.scalar('loss', float('nan'), step=2)\n"
    "print('logged')\n"
)


def _interpreters() -> list[str]:
    found = [sys.executable]
    found += sorted(glob.glob("/root/.pyenv/versions/3.8*/bin/python3"))[:1]
    found += [p for p in ("/usr/bin/python3",) if Path(p).exists()]
    return found


@pytest.mark.parametrize("python", _interpreters())
def test_the_zipapp_runs_a_task_and_the_task_imports_report_from_it(tmp_path, python):
    job = make_job(tmp_path, command=[python, "-c", SCALAR_TASK])
    zipapp.build(job / "klique-runner.pyz")
    env = runner_env()
    env.pop("PYTHONPATH")  # only the zipapp provides inside_job
    result = subprocess.run(
        [python, str(job / "klique-runner.pyz"), str(job)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(tmp_path),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert console(job) == "logged\n"
    assert read_json(job, "exit.json")["outcome"] == "completed"
    lines = [line for line in (job / "scalars.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    assert '"value": 0.5' in lines[0] and '"step": 1' in lines[0]
    assert '"value": null' in lines[1]


def test_the_zipapp_passes_on_the_tasks_exit_code(tmp_path):
    job = make_job(tmp_path, command=[sys.executable, "-c", "raise SystemExit(4)"])
    zipapp.build(job / "klique-runner.pyz")
    result = subprocess.run(
        [sys.executable, str(job / "klique-runner.pyz"), str(job)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 4


def test_the_zipapp_refuses_a_missing_argument(tmp_path):
    with_pyz = zipapp.build(tmp_path / "r.pyz")
    result = subprocess.run(
        [sys.executable, str(with_pyz)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2 and "usage" in result.stderr


# An account's user site runs this at every start of the system's Python.
STARTED_LOG = (
    "import os, sys\n"
    "with open(os.path.join(os.path.dirname(__file__), 'started.log'), 'a') as log:\n"
    "    log.write(repr(sys.argv) + '\\n')\n"
)


def test_the_runner_as_a_batch_job_starts_it_skips_the_accounts_site(tmp_path):
    """What `pip install --user` leaves in an account's user site (a usercustomize, .pth files)
    runs at every start of Python, and costs it: the runner, started by the batch template's
    line, skips it (and the node's site-packages, and PYTHON* variables); the task's own
    Python keeps it."""
    estate = load_estate(REPO_ROOT / "examples" / "estate.yaml")
    script = render_preview(estate, sample_task(estate, "1-gpu"), None, check=False).script
    launch = shlex.split(script.rstrip().splitlines()[-1])  # exec PYTHON FLAGS... RUNNER DIR
    assert launch[0] == "exec" and launch[-2].endswith("/klique-runner.pyz"), launch
    python = "/usr/bin/python3"  # the system's, as on a node (a venv has no user site)
    env = {**runner_env(), "HOME": str(tmp_path / "home")}
    env.pop("PYTHONPATH")
    found = [python, "-c", "import site; print(site.getusersitepackages())"]
    user_site = Path(subprocess.run(found, env=env, capture_output=True, text=True).stdout.strip())
    assert user_site.is_relative_to(tmp_path), user_site
    user_site.mkdir(parents=True)
    (user_site / "usercustomize.py").write_text(STARTED_LOG)
    job = make_job(tmp_path, command=[python, "-c", "print('the task')"])
    zipapp.build(job / "klique-runner.pyz")
    runner = [python, *launch[2:-2], str(job / "klique-runner.pyz"), str(job)]
    result = subprocess.run(runner, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert console(job) == "the task\n"
    assert (user_site / "started.log").read_text().splitlines() == [repr(["-c"])]
