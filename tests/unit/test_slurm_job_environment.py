"""The job's environment on Slurm, built on purpose: `--export` names the runner's variables,
the submit command starts without Slurm's input variables (sbatch(1), "INPUT ENVIRONMENT
VARIABLES": they override #SBATCH lines), and a compute resource's checkpoint signal is asked of
Slurm and reaches the task, never the runner's setup."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from broker.errors import EstateError
from broker.estate import parse_estate
from broker.fileops import SCRIPTS, tar_of
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


def test_the_jobs_environment_is_the_runners_own_variables():
    found = directives()
    [export] = [d for d in found if d.startswith("--export=")]
    assert export == "--export=PATH,HOME,USER,LOGNAME,LANG,LC_ALL,TZ,TMPDIR"
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


def fake_sbatch(tmp_path: Path) -> Path:
    """An `sbatch` that prints the environment it was started with."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / "sbatch"
    program.write_text("#!/bin/sh\nexec env\n")
    program.chmod(0o755)
    return bin_dir


def seen_by_sbatch(argv: list[str], tmp_path: Path) -> dict[str, str]:
    env = {**POLLUTED, "PATH": f"{fake_sbatch(tmp_path)}:/usr/bin:/bin"}
    stdin = tar_of({"job.sh": (b"#!/bin/sh\n", 0o700)})
    done = subprocess.run(argv, input=stdin, env=env, capture_output=True, check=True)
    return dict(line.split("=", 1) for line in done.stdout.decode().splitlines() if "=" in line)


def test_the_submit_command_starts_without_slurms_input_variables(tmp_path):
    argv = ["sh", "-c", SCRIPTS["unpack"], "sh", str(tmp_path / "job"), "sbatch", "job.sh"]
    seen = seen_by_sbatch(argv, tmp_path)
    assert not [name for name in seen if name.startswith(("SBATCH_", "SLURM_JOB"))]
    assert seen["SLURM_CONF"] == "/etc/slurm/site.conf" and seen["KEEP_ME"] == "yes"


def test_the_sudo_helper_clears_the_same_variables(tmp_path):
    helper = str(ROOT / "broker" / "helper.py")
    argv = [sys.executable, helper, "unpack", str(tmp_path / "job"), "sbatch", "job.sh"]
    seen = seen_by_sbatch(argv, tmp_path)
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
