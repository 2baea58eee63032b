"""Slurm pool details: a cancel before placement, uv staged beside the runner."""

import asyncio
import json
import pwd
import subprocess
from pathlib import Path

import pytest
from conftest import submitted_id
from helpers.batch import JOB_PYTHON, open_folder, shared_folder

from broker.agents.factory import build_runner
from broker.control.loop import ControlLoop
from broker.domain import TaskSpec, TaskState
from broker.estate import parse_estate
from broker.pools.base import Context
from broker.pools.slurm import SlurmDriver
from broker.store.repository import Store

pytestmark = pytest.mark.slurm

ESTATE = """
resources:
  cpu:
    profile: {{cpus: 1, memory: 100M, walltime: 10m, pools: [slurm]}}
pools:
  slurm:
    kind: slurm
    partition: debug
    job_root: {job_root}
    python: {python}
    poll_interval: 1s
    uv: stage
    user_map: {{alice: alice}}
"""


@pytest.fixture
def job_root(slurm_cluster):
    return open_folder(shared_folder("klique-extras-") / "jobs")


def job_ids(tag: str | None = None) -> list[int]:
    """Ids of the jobs Slurm still lists (all, or those named `tag`)."""
    argv = ["squeue", "--noheader", "--states=all", "--format=%i"]
    out = subprocess.run(
        argv + ([f"--name={tag}"] if tag else []), capture_output=True, text=True, check=True
    ).stdout
    return [int(x) for x in out.split()]


def newest_job_id() -> int:
    probe = subprocess.run(
        [
            "runuser",
            "-u",
            "alice",
            "--",
            "sbatch",
            "--parsable",
            "--hold",
            "--output=/dev/null",
            "--wrap=true",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    subprocess.run(["scancel", probe], check=True)
    return int(probe)


def test_a_task_cancelled_while_queued_in_klique_never_reaches_slurm(tmp_path, job_root):
    estate = parse_estate(ESTATE.format(job_root=job_root, python=JOB_PYTHON))
    store = Store.open(f"sqlite:///{tmp_path / 'k.db'}")
    context = Context(estate, tmp_path, build_runner(tmp_path), None)
    control = ControlLoop(
        store, estate, {"slurm": SlurmDriver(estate.pools["slurm"], context)}, tmp_path
    )
    task = store.create_task(TaskSpec(command=("true",), resource="cpu"), "alice", None)
    before = newest_job_id()

    async def cancel_then_cycle():
        await control.cancel(task)
        await control.cycle()  # placement
        await control.agents["slurm"].step()  # the pool's agent
        await control.drivers["slurm"].close()

    asyncio.run(cancel_then_cycle())
    final = store.get(task.id)
    assert final.state is TaskState.CANCELLED and final.native_id is None
    assert [e["to"] for e in store.events(task.id)] == ["queued", "cancelled"]
    assert [j for j in job_ids(task.tag) if j > before] == []
    assert newest_job_id() == before + 1  # nothing else was submitted in between
    assert not list(job_root.glob(f"{task.tag}-*"))


def test_a_staged_uv_builds_the_tasks_environment_on_the_node(server_factory, job_root):
    server = server_factory(ESTATE.format(job_root=job_root, python=JOB_PYTHON))
    alice = server.make_token("alice")
    code = "import six, sys; print('six', six.__version__, sys.prefix)"
    task_id = submitted_id(
        server.cli(
            "submit",
            "--no-code",
            "--json",
            "--requirement",
            "six==1.16.0",
            "--",
            "python",
            "-c",
            code,
            token=alice,
        )
    )
    task = server.wait_state(task_id, token=alice, timeout=180)
    logs = server.cli("logs", str(task_id), token=alice).output
    assert task["state"] == "completed", (task, logs)
    assert "six 1.16.0" in logs
    folder = job_root / ".klique-alice"  # alice's own: no other account can replace her uv
    staged = folder / "uv"
    assert staged.exists() and staged.stat().st_mode & 0o777 == 0o500
    assert folder.stat().st_uid == staged.stat().st_uid == pwd.getpwnam("alice").pw_uid
    assert folder.stat().st_mode & 0o777 == 0o700
    exit_doc = json.loads((Path(task["job_dir"]) / "exit.json").read_text())
    assert exit_doc["environment"]["tool"] == "uv", exit_doc
