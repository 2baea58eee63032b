"""A sweep's tasks on one Slurm pool go as one job array (sbatch --array), and each element is
followed, cancelled and requeued as its own task: Slurm's records are the judge."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.batch import JOB_PYTHON, start_now, sticky_job_root
from helpers.sweep import FINAL, ended_as, queue_sweep, run_with, until
from test_slurm_burst import ESTATE as BURST_ESTATE
from test_slurm_burst import jobs_named, listed_jobs, seeded_store

from broker.agents.factory import build_runner
from broker.control.loop import ControlLoop
from broker.domain import TaskState
from broker.estate import parse_estate
from broker.pools.base import Context
from broker.pools.slurm import SlurmDriver
from broker.store.repository import Store

pytestmark = pytest.mark.slurm

TASKS = 300
FAILS, CANCELLED, REQUEUED = 1, TASKS // 2, TASKS - 1  # places in the sweep
ESTATE = BURST_ESTATE.replace("max_queued: 100", "max_queued: 1000")


@pytest.fixture
def job_root(slurm_cluster: Any) -> Any:
    with sticky_job_root("klique-arrays-") as root:
        yield root


def slurm_control(
    tmp_path: Path, job_root: Path, more: str = ""
) -> tuple[Store, SlurmDriver, ControlLoop]:
    """A store whose ids are this run's alone, the Slurm pool (with `more` settings) and a
    control loop over them."""
    estate = parse_estate(ESTATE.format(job_root=job_root, python=JOB_PYTHON) + more)
    store = seeded_store(tmp_path / "k.db")
    context = Context(estate, tmp_path, build_runner(tmp_path), None)
    driver = SlurmDriver(estate.pools["slurm"], context)
    return store, driver, ControlLoop(store, estate, {"slurm": driver}, tmp_path)


def test_a_sweep_runs_as_one_job_array_with_each_element_its_own_task(
    tmp_path: Path, job_root: Path
) -> None:
    store, driver, control = slurm_control(tmp_path, job_root)
    marker = job_root / "ran-once"  # the requeued task's first run sleeps; its second ends
    commands = {
        FAILS: ("sh", "-c", "exit 3"),
        CANCELLED: ("sleep", "600"),
        REQUEUED: ("sh", "-c", 'test -e "$1" && exit 0; touch "$1"; sleep 600', "-", str(marker)),
    }
    ids = queue_sweep(store, TASKS, commands, "arrays")

    def in_state(index: int, state: TaskState) -> Callable[[], bool]:
        return lambda: store.get(ids[index]).state is state

    async def steps(running: asyncio.Task[None]) -> None:
        await until(lambda: all(store.get(i).native_id for i in ids), "every submission", running)
        await until(in_state(CANCELLED, TaskState.RUNNING), "the long task's start", running)
        await control.cancel(store.get(ids[CANCELLED]))
        # Requeued once its first run has begun its command and Klique has seen it run.
        first_run = lambda: marker.exists() and in_state(REQUEUED, TaskState.RUNNING)()  # noqa: E731
        await until(first_run, "the first run of the task to be requeued", running)
        job = str(store.get(ids[REQUEUED]).native_id)
        subprocess.run(["scontrol", "requeue", job], check=True)
        await asyncio.to_thread(start_now, dict(os.environ), job)
        ended = lambda: all(store.get(i).state in FINAL for i in ids)  # noqa: E731
        await until(ended, "the end of every task", running)

    run_with(control, driver, steps)
    tasks = ended_as(store, ids, {FAILS: TaskState.FAILED, CANCELLED: TaskState.CANCELLED})
    assert tasks[FAILS].exit_code == 3

    # One array job, its elements one per task, each task's own, in the sweep's order.
    arrays = {str(t.native_id).rpartition("_")[0] for t in tasks}
    assert len(arrays) == 1, arrays
    [array] = arrays
    assert [t.native_id for t in tasks] == [f"{array}_{n}" for n in range(TASKS)]
    assert sorted(listed_jobs("--array", f"--jobs={array}")) == sorted(
        str(t.native_id) for t in tasks
    )
    assert all(jobs_named(t.tag) == [] for t in tasks)  # no job of its own besides

    # The requeued element ran again under the same id; Klique saw it go back and end.
    back = [e for e in store.events(ids[REQUEUED]) if e["to"] == "pending"]
    assert any(e["reason"].startswith("requeued by slurm (restart 1)") for e in back), back
    assert Path(str(tasks[REQUEUED].job_dir), "exit.json").exists()
    store.close()


def test_arrays_turned_off_give_each_task_its_own_job(tmp_path: Path, job_root: Path) -> None:
    store, driver, control = slurm_control(tmp_path, job_root, "    job_arrays: false\n")
    ids = queue_sweep(store, 3, {}, "single")

    async def steps(running: asyncio.Task[None]) -> None:
        await until(lambda: all(store.get(i).state in FINAL for i in ids), "every end", running)

    run_with(control, driver, steps)
    tasks = ended_as(store, ids, {})
    assert all(jobs_named(t.tag) == [t.native_id] for t in tasks)
    store.close()
