"""The scheduler cycle: read the store, ask the pools, place, submit, write back."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from broker.domain import Estate, Task, TaskState
from broker.errors import KliqueError, SubmitUnknown, TransportError
from broker.pools.base import PoolDriver
from broker.scheduler.placement import (
    ActiveTask,
    PendingReason,
    PoolState,
    QueuedTask,
    SchedulerInput,
    place,
)
from broker.store.repository import Store

log = logging.getLogger("klique.scheduler")

ACTIVE = (TaskState.SUBMITTED, TaskState.PENDING, TaskState.RUNNING)
_HOLDING = (TaskState.PLACED, *ACTIVE)


@dataclass
class Scheduler:
    store: Store
    estate: Estate
    drivers: dict[str, PoolDriver]
    home: Path
    interval_s: float = 0.5
    pending: dict[int, PendingReason] = field(default_factory=dict)
    pool_states: dict[str, PoolState] = field(default_factory=dict)
    cycles: int = 0
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    def wake(self) -> None:
        """Run the next cycle now (a task was submitted or cancelled)."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.cycle()
            except Exception:  # a bad cycle must never stop the scheduler
                log.exception("scheduler cycle failed; retrying next cycle")
            self._wake.clear()
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
            await asyncio.wait(waits, timeout=self.interval_s, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()

    async def cycle(self) -> None:
        holding = self.store.tasks(states=_HOLDING)
        by_pool: dict[str, list[Task]] = {name: [] for name in self.drivers}
        for task in holding:
            if task.pool in by_pool:
                by_pool[task.pool].append(task)
        await asyncio.gather(*(self._follow(name, tasks) for name, tasks in by_pool.items()))
        holding = self.store.tasks(states=_HOLDING)
        by_pool = {name: [t for t in holding if t.pool == name] for name in self.drivers}
        states = await asyncio.gather(
            *(self._capacity(name, tasks) for name, tasks in by_pool.items())
        )
        self.pool_states = {s.name: s for s in states}
        queued = self.store.tasks(states=[TaskState.QUEUED])
        if queued:
            await self._place(queued, holding)
        else:
            self.pending = {}
        self.cycles += 1

    async def _follow(self, pool: str, tasks: Sequence[Task]) -> None:
        active = [t for t in tasks if t.state in ACTIVE]
        if not active:
            return
        try:
            news = await self.drivers[pool].poll(active)
        except KliqueError as exc:  # a failing status query never fails a task
            log.warning("pool %s: status query failed: %s", pool, exc)
            return
        for task_id, seen in news.items():
            self.store.change_state(
                task_id,
                seen.state,
                seen.reason or None,
                only_from=ACTIVE,
                **({"exit_code": seen.exit_code} if seen.exit_code is not None else {}),
            )

    async def _capacity(self, pool: str, tasks: Sequence[Task]) -> PoolState:
        try:
            return await self.drivers[pool].capacity(tasks)
        except KliqueError as exc:
            return PoolState(pool, reachable=False, reason=str(exc))

    async def _place(self, queued: Sequence[Task], holding: Sequence[Task]) -> None:
        now = time.time()
        inputs = SchedulerInput(
            estate=self.estate,
            queued=[
                QueuedTask(
                    t.id, t.owner, t.team, t.resource, t.queued_at or t.created_at, t.skip_pools
                )
                for t in queued
            ],
            active=[
                ActiveTask(
                    t.id,
                    t.owner,
                    t.team,
                    t.resource,
                    t.pool or "",
                    t.state is TaskState.RUNNING,
                    t.started_at or t.submitted_at or now,
                    t.borrowed,
                )
                for t in holding
            ],
            pools=self.pool_states,
            now=now,
        )
        out = place(inputs)
        self.pending = out.pending
        placed = []
        for decision in out.placements:
            task = self.store.change_state(
                decision.task_id,
                TaskState.PLACED,
                "",
                only_from=[TaskState.QUEUED],
                pool=decision.pool,
                borrowed=decision.borrowed,
            )
            if task is not None:
                placed.append(task)
        # Submissions to one pool overlap up to its submit_concurrency (pooled connections).
        limits = {
            name: asyncio.Semaphore(int(str(p.settings.get("submit_concurrency") or 8)))
            for name, p in self.estate.pools.items()
        }

        async def submit(task: Task) -> None:
            async with limits[task.pool or ""]:
                await self._submit(task)

        await asyncio.gather(*(submit(t) for t in placed))

    async def _submit(self, task: Task) -> None:
        driver = self.drivers[task.pool or ""]
        try:
            done = await driver.submit(task)
        except SubmitUnknown as exc:
            log.warning("task %s: submission outcome unknown: %s", task.id, exc)
            return  # stays PLACED; reconciliation looks its tag up before any retry
        except TransportError as exc:
            self.store.change_state(
                task.id,
                TaskState.QUEUED,
                f"pool {task.pool} unreachable: {exc}",
                only_from=[TaskState.PLACED],
                pool=None,
            )
            return
        except KliqueError as exc:  # refused: the pool's words, an unmapped user, a template
            self.store.change_state(
                task.id,
                TaskState.FAILED,
                f"refused by pool {task.pool}: {exc}",
                only_from=[TaskState.PLACED],
            )
            return
        moved = self.store.change_state(
            task.id,
            TaskState.SUBMITTED,
            "",
            only_from=[TaskState.PLACED],
            native_id=done.native_id,
            job_dir=done.job_dir,
        )
        if moved is None:  # cancelled while the pool was accepting it
            await driver.cancel(
                self.store.update(task.id, native_id=done.native_id, job_dir=done.job_dir)
            )

    async def cancel(self, task: Task) -> Task:
        """Cancel a task wherever it is; one still queued in Klique never reaches a pool."""
        early = (TaskState.CREATED, TaskState.QUEUED, TaskState.HELD, TaskState.PLACED)
        done = self.store.change_state(
            task.id, TaskState.CANCELLED, "cancelled by its owner", only_from=early
        )
        if done is not None:
            return done
        if task.state in ACTIVE and task.pool in self.drivers:
            await self.drivers[task.pool].cancel(task)
        done = self.store.change_state(
            task.id, TaskState.CANCELLED, "cancelled by its owner", only_from=ACTIVE
        )
        return done or self.store.get(task.id)
