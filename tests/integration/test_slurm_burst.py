"""A burst of submissions to the Slurm pool goes in one command per account and batch, not
one per task; every task still gets exactly one Slurm job, and ends."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers.batch import JOB_PYTHON, sticky_job_root

from broker import fileops
from broker.agents.factory import build_runner
from broker.control.loop import ControlLoop
from broker.domain import TaskSpec, TaskState
from broker.estate import parse_estate
from broker.pools.base import Context
from broker.pools.slurm import SlurmDriver
from broker.store.repository import Store

pytestmark = pytest.mark.slurm

TASKS = 40
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
    max_queued: 100
    user_map: {{alice: alice, bob: bob}}
"""
FINAL = {TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELLED, TaskState.TIMEOUT}


@pytest.fixture
def job_root(slurm_cluster: Any) -> Any:
    with sticky_job_root("klique-burst-") as root:
        yield root


def seeded_store(path: Path) -> Store:
    """A store whose task ids start past any other run's on the shared cluster, so that each
    tag (klique-<id>) names this run's jobs only."""
    store = Store.open(f"sqlite:///{path}")
    seed = store.create_task(TaskSpec(("true",), "cpu"), "alice", None, state=TaskState.CANCELLED)
    store.close()
    base = int(time.time() * 1000) % 10**12
    with sqlite3.connect(path) as db:
        db.execute("UPDATE task_events SET task_id = ? WHERE task_id = ?", (base, seed.id))
        db.execute("UPDATE tasks SET id = ? WHERE id = ?", (base, seed.id))
    return Store.open(f"sqlite:///{path}")


def jobs_named(tag: str) -> list[str]:
    """Every job Slurm lists by this name, finished ones included (for MinJobAge, 300 s)."""
    return listed_jobs(f"--name={tag}")


def listed_jobs(*selection: str) -> list[str]:
    """The ids of the jobs squeue lists with these options, finished ones included."""
    argv = ["squeue", "--noheader", "--states=all", *selection, "--format=%i"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()


def test_a_burst_is_submitted_in_few_commands_with_one_job_per_task(
    tmp_path: Path, job_root: Path
) -> None:
    estate = parse_estate(ESTATE.format(job_root=job_root, python=JOB_PYTHON))
    store = seeded_store(tmp_path / "k.db")
    context = Context(estate, tmp_path, build_runner(tmp_path), None)
    driver = SlurmDriver(estate.pools["slurm"], context)
    submits: list[int] = []  # items in each submitting command the transport ran
    run = driver.transport.run

    async def counted(argv: Sequence[str], **kwargs: Any) -> Any:
        if fileops.SCRIPTS["submit-each"] in argv:
            submits.append(sum(1 for word in argv if word.endswith("/job.sh")))
        elif fileops.SCRIPTS["unpack"] in argv:
            submits.append(1)
        return await run(argv, **kwargs)

    driver.transport.run = counted  # type: ignore[method-assign]
    control = ControlLoop(store, estate, {"slurm": driver}, tmp_path)
    owners = ["alice", "bob"]
    spec = TaskSpec(command=("true",), resource="cpu")
    ids = [store.create_task(spec, owners[n % 2], None).id for n in range(TASKS)]

    async def until_all_ended() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(control.run(stop))
        deadline = time.monotonic() + 300
        try:
            while not all(store.get(i).state in FINAL for i in ids):
                assert time.monotonic() < deadline, "the tasks did not all end within 300 s"
                assert not running.done(), running
                await asyncio.sleep(0.2)
        finally:
            stop.set()
            await running
            await driver.close()

    asyncio.run(until_all_ended())
    tasks = [store.get(i) for i in ids]
    assert [t.state for t in tasks] == [TaskState.COMPLETED] * TASKS, [
        (t.id, t.state, t.reason) for t in tasks if t.state is not TaskState.COMPLETED
    ]
    assert sum(submits) == TASKS  # each task submitted once
    assert len(submits) <= TASKS // 4, submits  # far fewer commands than tasks
    for task in tasks:
        assert jobs_named(task.tag) == [task.native_id], task.tag
