"""The runner as the broker ships it: klique-runner.pyz in the job directory, on any python3.8+."""

from __future__ import annotations

import glob
import subprocess
import sys
from pathlib import Path

import pytest
from runner_helpers import console, make_job, read_json, runner_env

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
