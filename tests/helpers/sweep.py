"""A sweep through a real placement loop, for each scheduler's job-array test: its tasks queued
in a store, the control loop running while the test's steps act, and how each task ended."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from broker.agents.factory import build_runner
from broker.control.loop import ControlLoop
from broker.domain import Task, TaskSpec, TaskState
from broker.estate import parse_estate
from broker.pools.base import Context, PoolDriver
from broker.store.repository import Store
from helpers.batch import pool_yaml

FINAL = frozenset({TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELLED, TaskState.TIMEOUT})
Steps = Callable[[asyncio.Task[None]], Awaitable[None]]


# A simulated LSF minute as long as LSF's own. helpers.batch's 3 s minute ends a sweep's 10-minute
# task after 30 s, which a loaded machine's server restart can take; these tests time no limit.
LSF_MINUTE = {"KLIQUE_SIM_LSF_MINUTE": "60"}


def sweep_estate(scheduler: str, job_root: Path) -> str:
    """An estate with one pool, `batch`, of the scheduler (a simulator's on PATH, or Slurm's),
    and one compute resource on it, `cpu`."""
    return (
        "resources:\n"
        "  cpu:\n"
        "    profile: {cpus: 1, memory: 100M, walltime: 10m, pools: [batch]}\n"
        f"pools:\n{pool_yaml(scheduler, job_root, None)}"
    )


def control_over(
    scheduler: str, job_root: Path, folder: Path, driver_class: Any
) -> tuple[Store, Any, ControlLoop]:
    """A store in `folder`, the pool `batch` of `sweep_estate` (a `driver_class`) and a
    control loop over them."""
    estate = parse_estate(sweep_estate(scheduler, job_root))
    store = Store.open(f"sqlite:///{folder / 'k.db'}")
    driver = driver_class(
        estate.pools["batch"], Context(estate, folder, build_runner(folder), None)
    )
    return store, driver, ControlLoop(store, estate, {"batch": driver}, folder)


def runs_twice(record: Path, go: Path) -> tuple[str, ...]:
    """A command whose first run notes itself in `record` and sleeps, to be requeued; its
    second run notes itself and ends once `go` exists (the test has seen what it waits for)."""
    script = (
        'echo run >>"$1"; [ "$(wc -l <"$1")" -lt 2 ] && exec sleep 600; '
        'while [ ! -e "$2" ]; do sleep 0.1; done'
    )
    return ("sh", "-c", script, "-", str(record), str(go))


def runs_of(record: Path) -> int:
    """How many runs the command of `runs_twice` has noted."""
    return len(record.read_text().splitlines()) if record.exists() else 0


def queue_sweep(
    store: Store, count: int, commands: Mapping[int, Sequence[str]], sweep: str
) -> list[int]:
    """One sweep of alice's on resource `cpu`: `true`, or at place n the command `commands[n]`."""
    items = [(TaskSpec(tuple(commands.get(n, ("true",))), "cpu"), 0.0, {}) for n in range(count)]
    _sweep, created = store.create_queued(items, "alice", None, sweep=sweep)
    return [t.id for t in created]


async def until(
    done: Callable[[], bool], what: str, running: asyncio.Task[None], timeout: float = 300
) -> None:
    """Wait for `done` while the control loop runs (its failure is the test's)."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:g} s"
        assert not running.done(), running
        await asyncio.sleep(0.2)


def run_with(control: ControlLoop, driver: PoolDriver, steps: Steps) -> None:
    """The control loop, running while `steps` act; stopped, and the pool closed, after."""

    async def scenario() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(control.run(stop))
        try:
            await steps(running)
        finally:
            stop.set()
            await running
            await driver.close()

    asyncio.run(scenario())


def ended_as(store: Store, ids: Sequence[int], expected: Mapping[int, TaskState]) -> list[Task]:
    """The tasks, each of which must have ended as `expected` says at its place (else
    COMPLETED)."""
    tasks = [store.get(i) for i in ids]
    wanted = [expected.get(n, TaskState.COMPLETED) for n in range(len(ids))]
    wrong = [(t.id, t.state, t.reason) for t, w in zip(tasks, wanted, strict=True) if t.state != w]
    assert not wrong, wrong
    return tasks
