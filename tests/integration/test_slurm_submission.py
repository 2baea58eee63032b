"""The job's environment on the shared Slurm cluster: a submitting environment's SBATCH_*
variables do not change the job (sbatch(1): they would override the script's #SBATCH lines),
and a compute resource's checkpoint signal reaches the task before its walltime."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TASK_PY, submitted_id
from helpers.batch import JOB_PYTHON, open_folder, shared_folder

from broker.fileops import ITEM_LINE, SCRIPTS, tar_of

pytestmark = pytest.mark.slurm

# What a login shell or a sudo rule could hand the submit command: another partition and
# another time limit than the script's.
LOGIN_ENV = {"SBATCH_PARTITION": "gpu", "SBATCH_TIMELIMIT": "7"}
SCRIPT = """#!/bin/bash
#SBATCH --job-name=klique-env-check
#SBATCH --partition=debug
#SBATCH --time=00:05:00
#SBATCH --hold
#SBATCH --output=/dev/null
true
"""


@pytest.fixture
def folder(slurm_cluster) -> Path:
    return open_folder(shared_folder("klique-submit-env-") / "jobs")


@pytest.fixture
def held_jobs() -> Iterator[list[str]]:
    ids: list[str] = []
    yield ids
    for job_id in ids:  # held: they never ran; leave nothing behind on the shared cluster
        subprocess.run(["scancel", job_id], check=False)


def as_alice(argv: list[str], stdin: bytes | None = None) -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "SLURM_CONF": os.environ.get("SLURM_CONF", "/tmp/klique-slurm/etc/slurm.conf"),
        **LOGIN_ENV,
    }
    command = ["runuser", "-u", "alice", "--", "env", "-i", *(f"{k}={v}" for k, v in env.items())]
    done = subprocess.run([*command, *argv], input=stdin, capture_output=True, check=True)
    return done.stdout.decode().strip().splitlines()[-1]


def job_fields(job_id: str) -> dict[str, str]:
    shown = subprocess.run(
        ["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True
    ).stdout
    return dict(re.findall(r"(\w+)=(\S*)", shown))


def test_sbatch_variables_of_the_submitting_environment_do_not_change_the_job(folder, held_jobs):
    plain = folder / "plain.sh"
    plain.write_text(SCRIPT)
    plain.chmod(0o755)
    # Without clearing, the environment wins over the script (the hazard is real here).
    held_jobs.append(as_alice(["sbatch", "--parsable", str(plain)]))
    hazard = job_fields(held_jobs[-1])
    assert (hazard["Partition"], hazard["TimeLimit"]) == ("gpu", "00:07:00")
    # Klique's submission: the job folder's unpack, then sbatch, as the transport runs them.
    job_dir = folder / "klique-env"
    unpack = ["sh", "-c", SCRIPTS["unpack"], "sh", str(job_dir)]
    stdin = tar_of({"job.sh": (SCRIPT.encode(), 0o700)})
    held_jobs.append(as_alice([*unpack, "sbatch", "--parsable", f"{job_dir}/job.sh"], stdin))
    job = job_fields(held_jobs[-1])
    assert (job["Partition"], job["TimeLimit"]) == ("debug", "00:05:00")
    assert job["UserId"].startswith("alice(")
    # The same through unpack-each and submit-each, for a burst of submissions.
    many_dir = folder / "klique-env-many"
    files = tar_of({f"{many_dir.name}/job.sh": (SCRIPT.encode(), 0o700)})
    as_alice(["sh", "-c", SCRIPTS["unpack-each"], "sh", str(folder), many_dir.name], files)
    words = ["3", "sbatch", "--parsable", f"{many_dir}/job.sh"]
    line = as_alice(["sh", "-c", SCRIPTS["submit-each"], "sh", *words])
    answer = ITEM_LINE.fullmatch(line)
    assert answer and answer[2] == "0", line
    held_jobs.append(base64.b64decode(answer[3]).decode().strip())
    job = job_fields(held_jobs[-1])
    assert (job["Partition"], job["TimeLimit"]) == ("debug", "00:05:00")


# Slurm may send the signal up to 60 s before the time asked (sbatch(1), --signal), and the
# runner drops a checkpoint signal that comes before the task starts: 3 min less 50 s less 60 s
# leaves the task 70 s to start, under any load this machine sees (2 min left it 10 s).
ESTATE = """
resources:
  ckpt:
    profile: {{cpus: 1, memory: 100M, walltime: 3m, pools: [slurm]}}
    checkpoint_signal: {{signal: USR1, before: 50s}}
pools:
  slurm: {{kind: slurm, partition: debug, job_root: "{job_root}", python: "{python}",
          poll_interval: 1s, user_map: {{alice: alice}}}}
"""

# Saves its state on USR1 and ends; without the signal it runs into its walltime (TIMEOUT).
# Slurm may send the signal up to 60 s early (sbatch(1) --signal): a 2-minute walltime keeps it
# at least 10 s after the start, once the runner is there to take it.
CHECKPOINTING = (
    "import signal, sys, time\n"
    "def save(signum, frame):\n"
    "    print('checkpoint on', signal.Signals(signum).name, flush=True)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGUSR1, save)\n"
    "print('started', flush=True)\n"
    "time.sleep(600)\n"
)


def test_a_task_receives_its_checkpoint_signal_before_its_walltime(server_factory, folder):
    server = server_factory(ESTATE.format(job_root=folder, python=JOB_PYTHON))
    alice = server.make_token("alice")
    args = ("submit", "--no-code", "--json", "-r", "ckpt", "--", TASK_PY, "-c", CHECKPOINTING)
    task_id = submitted_id(server.cli(*args, token=alice))
    task = server.wait_state(task_id, token=alice, timeout=360)
    logs = server.cli("logs", str(task_id), token=alice).output
    assert task["state"] == "completed", (task, logs)
    assert "checkpoint on SIGUSR1" in logs


PLAIN = """
resources:
  cpu: {{profile: {{cpus: 1, memory: 100M, walltime: 2m, pools: [slurm]}}}}
pools:
  slurm: {{kind: slurm, partition: debug, job_root: "{job_root}", poll_interval: 1s,
          user_map: {{alice: alice}}}}
"""
PROBE = "KLIQUE_LOGIN_PROFILE_PROBE"
PRINT_ENV = "#!/bin/sh\nenv\n"


@pytest.fixture
def login_profile() -> Iterator[None]:
    """alice's login profile exports a variable, as a site's module setup or her own would."""
    profile = Path("~alice/.profile").expanduser()
    saved = profile.read_bytes() if profile.exists() else None
    with profile.open("ab") as out:
        out.write(f"\nexport {PROBE}=from-the-login-profile\n".encode())
    shutil.chown(profile, "alice")
    try:
        yield
    finally:
        if saved is None:
            profile.unlink()
        else:
            profile.write_bytes(saved)


def test_a_slurm_job_gets_no_login_environment(server_factory, folder, login_profile):
    # The hazard is real here: with a list of names, sbatch(1) --export has slurmd run the
    # account's login shell for every job and add what it exports.
    script = folder / "print-env.sh"
    script.write_text(PRINT_ENV)
    script.chmod(0o755)
    output = folder / "listed.out"
    listed = ["--export=PATH,HOME", "--partition=debug", "--time=1", f"--output={output}"]
    as_alice(["sbatch", "--wait", *listed, str(script)])
    assert f"{PROBE}=" in output.read_text()
    # A task: its job exports sbatch's environment, which the submit step made the job's own.
    server = server_factory(PLAIN.format(job_root=folder))
    alice = server.make_token("alice")
    args = ("submit", "--no-code", "--json", "-r", "cpu", "--", "env")
    task_id = submitted_id(server.cli(*args, token=alice))
    task = server.wait_state(task_id, token=alice, timeout=120)
    logs = server.cli("logs", str(task_id), token=alice).output
    assert task["state"] == "completed", (task, logs)
    seen = dict(line.split("=", 1) for line in logs.splitlines() if "=" in line)
    assert seen["HOME"] == "/home/alice" and seen["USER"] == "alice" and "SLURM_JOB_ID" in seen
    assert PROBE not in seen and "SLURM_GET_USER_ENV" not in seen, logs
