"""What a pool's agent tells the control plane, written through the one state machine.

An agent inside the server uses StoreLink directly; `klique agent` on a login node sends the
same calls over the agent API, where StoreLink applies them. Either way the control plane keeps
placement, policies and the ledger; agents only say what their pools did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from broker.domain import Estate, Task, TaskState, can_transition
from broker.pools.base import Observation
from broker.scheduler.placement import PoolState
from broker.store.repository import Store

ACTIVE = (TaskState.SUBMITTED, TaskState.PENDING, TaskState.RUNNING)
HOLDING = (TaskState.PLACED, *ACTIVE)


class ControlPlane(Protocol):
    """The calls an agent makes; each returns once the control plane has recorded it."""

    async def holding(self, pool: str) -> list[Task]:
        """The pool's tasks: placed (to submit, or to look up), submitted, pending, running."""

    async def begin(self, task: Task, job_dir: str, digest: str) -> Task | None:
        """About to submit: record the attempt's folder and report-token digest first.
        None when the task is no longer placed (cancelled meanwhile): submit nothing."""

    async def submitted(self, task: Task, native_id: str | None, job_dir: str | None) -> bool:
        """The pool accepted it; False when it was cancelled meanwhile (cancel the job)."""

    async def observed(self, task: Task, seen: Observation) -> None: ...

    async def requeue(
        self, task: Task, reason: str, *, skip: bool, only_from: Sequence[TaskState]
    ) -> None:
        """Back to Klique's queue (spill-over skips this pool next time)."""

    async def refused(self, task: Task, reason: str) -> None:
        """The pool refused a placed task: it fails with the pool's words."""

    async def cancelled(self, task: Task, reason: str) -> None: ...

    async def published(self, pool: str, state: PoolState, strangers: Sequence[str]) -> None:
        """The pool's latest capacity and reachability, for placement."""


def _may_move(old: TaskState, seen: Observation) -> bool:
    back = old is TaskState.RUNNING and seen.state is TaskState.PENDING and not seen.requeued
    return can_transition(old, seen.state) and not back


class StoreLink:
    """The control plane's own side: every call one short transaction, off the event loop."""

    def __init__(self, store: Store, estate: Estate) -> None:
        self.store = store
        self.estate = estate

    async def holding(self, pool: str) -> list[Task]:
        return await asyncio.to_thread(self.store.tasks, states=HOLDING, pool=pool)

    async def begin(self, task: Task, job_dir: str, digest: str) -> Task | None:
        def write() -> Task | None:
            current = self.store.get(task.id)
            if current.state is not TaskState.PLACED:
                return None
            return self.store.update(task.id, job_dir=job_dir, report_digest=digest)

        return await asyncio.to_thread(write)

    async def submitted(self, task: Task, native_id: str | None, job_dir: str | None) -> bool:
        done = await asyncio.to_thread(
            self.store.change_state,
            task.id,
            TaskState.SUBMITTED,
            "",
            only_from=[TaskState.PLACED],
            native_id=native_id,
            job_dir=job_dir,
        )
        if done is None:  # cancelled while the pool was accepting it: keep where the job is
            await asyncio.to_thread(
                self.store.update, task.id, native_id=native_id, job_dir=job_dir
            )
        return done is not None

    async def observed(self, task: Task, seen: Observation) -> None:
        if task.state is TaskState.PLACED:
            await self._adopt(task, seen)
        elif seen.state.final and (seen.retry or self._requeues(task, seen)):
            await self.requeue(task, f"{seen.reason}; requeued", skip=False, only_from=HOLDING)
        else:
            extra = {"exit_code": seen.exit_code} if seen.exit_code is not None else {}
            # The listing may be older than a runner's own report (pending after running):
            # only a move the state machine allows from where the task is now is made, and a
            # running task goes back to pending only when the scheduler requeued its job.
            moves = [s for s in ACTIVE if _may_move(s, seen)]
            await asyncio.to_thread(
                self.store.change_state,
                task.id,
                seen.state,
                seen.reason,
                only_from=moves,
                charged=seen.charged,
                **extra,
            )

    async def _adopt(self, task: Task, seen: Observation) -> None:
        """A placed task whose submission's outcome was unknown: found, or safe to resubmit."""
        if seen.state is TaskState.QUEUED:
            await self.requeue(task, seen.reason, skip=False, only_from=[TaskState.PLACED])
        else:
            await self.submitted(task, seen.native_id, seen.job_dir)

    def _requeues(self, task: Task, seen: Observation) -> bool:
        """Preempted runs go back to the queue: reclaimed by Klique, or by the pool if it says."""
        if task.preempted:
            return True
        pool = self.estate.pools.get(task.pool or "")
        return bool(seen.preempted and pool and pool.settings.get("requeue_preempted"))

    async def requeue(
        self, task: Task, reason: str, *, skip: bool, only_from: Sequence[TaskState]
    ) -> None:
        skip_pools = task.skip_pools | ({task.pool} if skip and task.pool else set())
        await asyncio.to_thread(
            self.store.change_state,
            task.id,
            TaskState.QUEUED,
            reason,
            only_from=only_from,
            pool=None,
            native_id=None,
            job_dir=None,
            borrowed=False,
            preempted=False,
            gpu_ids=[],
            skip_pools=skip_pools,
        )

    async def refused(self, task: Task, reason: str) -> None:
        await asyncio.to_thread(
            self.store.change_state,
            task.id,
            TaskState.FAILED,
            reason,
            only_from=[TaskState.PLACED],
        )

    async def cancelled(self, task: Task, reason: str) -> None:
        await asyncio.to_thread(
            self.store.change_state, task.id, TaskState.CANCELLED, reason, only_from=HOLDING
        )

    async def published(self, pool: str, state: PoolState, strangers: Sequence[str]) -> None:
        return None  # an agent in this server is read directly
