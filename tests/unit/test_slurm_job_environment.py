"""The job's environment on Slurm, built on purpose: sbatch starts with the job's variables
only and exports them all (a list of names would have slurmd add the account's login
environment), the submit command starts without Slurm's input variables (sbatch(1), "INPUT
ENVIRONMENT VARIABLES": they override #SBATCH lines), and a compute resource's checkpoint signal
is asked of Slurm and reaches the task, never the runner's setup."""

from __future__ import annotations

import base64
import importlib.util
import os
import signal
import subprocess
from pathlib import Path

import pytest
from helpers.confined import confined_helper

from broker.errors import EstateError
from broker.estate import parse_estate
from broker.fileops import ITEM_LINE, SCRIPTS, SLURM_JOB_ENV, tar_of
from broker.pools.base import Context
from broker.pools.slurm import SlurmDriver
from broker.preview import sample_task
from inside_job import process

ROOT = Path(__file__).resolve().parents[2]
POLLUTED = {
    "SBATCH_TIMELIMIT": "1",
    "SBATCH_PARTITION": "elsewhere",
    "SLURM_JOB_ID": "4",
    "SLURM_CONF": "/etc/slurm/site.conf",
    "KEEP_ME": "yes",
}


PLAIN = """
resources:
  r: {profile: {pools: [p], cpus: 1, walltime: 1h}}
pools:
  p: {kind: slurm, job_root: /jobs, user_map: {alice: alice}}
"""


def directives(text: str = PLAIN) -> list[str]:
    estate = parse_estate(text)
    driver = SlurmDriver(estate.pools["p"], Context(estate, Path("."), Path(__file__), None))
    task = sample_task(estate, "r", "alice")
    return driver.directives(task, estate.resources["r"].profile, "/jobs/k")


def test_the_job_exports_sbatchs_environment_whole():
    found = directives()
    [export] = [d for d in found if d.startswith("--export=")]
    assert export == "--export=ALL"  # a list, or NONE, sets SLURM_GET_USER_ENV (sbatch.c)
    assert not any(d.startswith("--signal") for d in found)


CHECKPOINTED = """
resources:
  r:
    profile: {{pools: [p], cpus: 1, walltime: {walltime}}}
    checkpoint_signal: {signal}
pools:
  p: {{kind: slurm, job_root: /jobs, user_map: {{alice: alice}}}}
"""


def test_a_checkpoint_signal_is_sent_to_the_batch_shell_before_the_walltime():
    text = CHECKPOINTED.format(walltime="1h", signal="{signal: USR1, before: 2m}")
    assert "--signal=B:USR1@120" in directives(text)


@pytest.mark.parametrize(
    ("walltime", "signal", "words"),
    [
        ("1m", "{signal: USR1, before: 2m}", "not shorter than the walltime"),
        ("1h", "{signal: TERM, before: 2m}", "USR1"),
        ("1h", "{signal: USR1}", "before"),
    ],
)
def test_a_checkpoint_signal_the_runner_cannot_pass_on_is_refused(walltime, signal, words):
    with pytest.raises(EstateError, match=words):
        parse_estate(CHECKPOINTED.format(walltime=walltime, signal=signal))


def fake_submit(tmp_path: Path) -> Path:
    """An `sbatch` and a `qsub` that print the environment they were started with."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sbatch", "qsub"):
        program = bin_dir / name
        program.write_text("#!/bin/sh\nexec env\n")
        program.chmod(0o755)
    return bin_dir


HELPER = str(ROOT / "broker" / "helper.py")
# Each step that starts a submit command: the job folder's unpack, and submit-each for a burst;
# as the shell scripts that a login shell runs, and as the sudo helper.
STEPS = [
    pytest.param(step, by, id=f"{step}-{by}")
    for step in ("unpack", "submit-each")
    for by in ("shell", "helper")
]


def seen_by(program: str, step: str, by: str, tmp_path: Path) -> dict[str, str]:
    """The environment `program` starts with, run by this submit step (the helper installed
    with tmp_path as its job root, and the fakes as the scheduler's commands)."""
    fakes = fake_submit(tmp_path)
    env = {**POLLUTED, "PATH": f"{fakes}:/usr/bin:/bin", "HOME": "/home/a"}
    stdin = b""
    with confined_helper([tmp_path], scheduler_path=str(fakes)) as helper:
        argv = ["sh", "-c", SCRIPTS[step], "sh"] if by == "shell" else [str(helper), step]
        if step == "unpack":
            stdin = tar_of({"job.sh": (b"#!/bin/sh\n", 0o700)})
            argv += [str(tmp_path / "job"), program, "job.sh"]
        else:
            argv += ["2", program, "job.sh"]
        done = subprocess.run(argv, input=stdin, env=env, capture_output=True, check=True)
    printed = done.stdout.decode()
    if step == "submit-each":
        answer = ITEM_LINE.fullmatch(printed.strip())
        assert answer and answer[2] == "0", printed
        printed = base64.b64decode(answer[3]).decode()
    seen = dict(line.split("=", 1) for line in printed.splitlines() if "=" in line)
    seen.pop("PWD", None)  # the fake's own shell sets it
    return seen


@pytest.mark.parametrize(("step", "by"), STEPS)
def test_sbatch_starts_with_the_jobs_variables_only(step, by, tmp_path):
    seen = seen_by("sbatch", step, by, tmp_path)
    assert seen.pop("PATH").startswith(str(tmp_path))
    assert seen == {"HOME": "/home/a", "SLURM_CONF": "/etc/slurm/site.conf"}


@pytest.mark.parametrize(("step", "by"), STEPS)
def test_another_submit_command_starts_without_slurms_input_variables(step, by, tmp_path):
    seen = seen_by("qsub", step, by, tmp_path)
    assert not [name for name in seen if name.startswith(("SBATCH_", "SLURM_JOB"))]
    assert seen["SLURM_CONF"] == "/etc/slurm/site.conf" and seen["KEEP_ME"] == "yes"


@pytest.fixture
def forwarder():
    saved = {s: signal.getsignal(s) for s in process.FORWARDED}
    yield process.SignalForwarder()
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_a_checkpoint_signal_before_the_task_starts_does_not_end_the_setup(forwarder):
    os.kill(os.getpid(), signal.SIGUSR1)  # handled at once: this thread is the main one
    assert forwarder.stop_signal() is None
    with pytest.raises(process.Terminated):
        os.kill(os.getpid(), signal.SIGTERM)


def test_the_sudo_helper_keeps_the_same_job_variables():
    """klique-helper stands alone (standard library only), so it keeps its own copy."""
    spec = importlib.util.spec_from_file_location("klique_helper", HELPER)
    assert spec is not None and spec.loader is not None
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    assert helper.SLURM_JOB_ENV == SLURM_JOB_ENV
