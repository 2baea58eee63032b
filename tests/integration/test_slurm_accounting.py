"""The Slurm pool with `accounting: slurmdbd`, on a private cluster that runs slurmdbd with
MariaDB (tests/conftest_services.py `accounting_slurm_cluster`) and forgets a finished job after
2 s (MinJobAge): what Klique learns of a job that left the queue comes from slurmdbd, and a
task ends as it did, judged against slurmdbd's own records."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Server, start_server, stop_server, submitted_id
from helpers.batch import JOB_PYTHON, open_folder, pool_yaml, remove_tree, shared_folder

pytestmark = pytest.mark.slurm

# The task kills the runner that started it (its parent) with SIGKILL, as an out-of-memory
# killer would: no exit file is written, and Slurm records the batch step's signal.
KILL_THE_RUNNER = "import os; os.kill(os.getppid(), 9)"

ESTATE = """
resources:
  cpu:
    profile: {cpus: 1, memory: 100M, walltime: 10m, pools: [batch]}
pools:
"""


@pytest.fixture(scope="module")
def accounted(accounting_slurm_cluster) -> Iterator[tuple[Server, Path, dict[str, str]]]:
    folder = shared_folder("klique-slurm-accounting-")
    job_root = open_folder(accounting_slurm_cluster.work / f"jobs-{folder.name}")
    estate = folder / "estate.yaml"
    # The grace for a missing exit file (lost_after) outlasts MinJobAge by far, so the job has
    # left Slurm's queue, and slurmdbd alone has it, when Klique decides.
    estate.write_text(
        ESTATE + pool_yaml("slurm", job_root, None, accounting="slurmdbd", lost_after="20s")
    )
    env = {"PATH": os.environ["PATH"], "SLURM_CONF": str(accounting_slurm_cluster.conf)}
    server = start_server(folder / "home", estate, env)
    try:
        yield server, job_root, env
    finally:
        stop_server(server)
        remove_tree(job_root)
        remove_tree(folder)


def slurmdbd_jobs(
    env: dict[str, str], tags: list[str], since: float
) -> dict[str, list[tuple[str, str]]]:
    """slurmdbd's record of every job named by one of `tags` that started after `since` (its
    database outlives a test session, whose task ids start again at 1): name -> [(state,
    ExitCode)]."""
    done = subprocess.run(
        [
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            "--allusers",
            f"--starttime={time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(since - 1))}",
            f"--name={','.join(tags)}",
            "--format=JobName,State,ExitCode",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    found: dict[str, list[tuple[str, str]]] = {}
    for line in done.stdout.splitlines():
        name, state, code = line.split("|")
        found.setdefault(name, []).append((state.split()[0], code))
    return found


def test_tasks_end_as_they_did_when_slurmdbd_alone_remembers_their_jobs(accounted):
    server, _job_root, env = accounted
    since = time.time()
    token = server.make_token("alice")

    def submit(*command: str) -> int:
        args = ("submit", "--no-code", "--json", "-r", "cpu", "--", *command)
        return submitted_id(server.cli(*args, token=token))

    tasks = {
        "exit 3": submit(JOB_PYTHON, "-c", "raise SystemExit(3)"),
        "exit 130": submit(JOB_PYTHON, "-c", "raise SystemExit(130)"),
        "runner killed": submit(JOB_PYTHON, "-c", KILL_THE_RUNNER),
    }
    ended = {what: server.wait_state(tid, timeout=180, token=token) for what, tid in tasks.items()}

    # The runner's exit file decides where there is one: exit 130 reads 130, although slurmdbd
    # keeps only its low bits (2:0).
    assert (ended["exit 3"]["state"], ended["exit 3"]["exit_code"]) == ("failed", 3)
    assert (ended["exit 130"]["state"], ended["exit 130"]["exit_code"]) == ("failed", 130)
    # Without one, slurmdbd's record: FAILED by signal 9, read as 128 + 9 under either accounting.
    killed = ended["runner killed"]
    assert killed["state"] == "lost", killed
    assert f"job {killed['native_id']} ended (slurm FAILED, exit code 137)" in killed["reason"]

    records = slurmdbd_jobs(env, [f"klique-{tid}" for tid in tasks.values()], since)
    assert records == {
        f"klique-{tasks['exit 3']}": [("FAILED", "3:0")],
        f"klique-{tasks['exit 130']}": [("FAILED", "2:0")],
        f"klique-{tasks['runner killed']}": [("FAILED", "0:9")],
    }
