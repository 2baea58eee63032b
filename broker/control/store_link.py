"""The control plane's own side of an agent's link: each call of the ControlPlane protocol
(broker/agents/link.py) written through the one state machine, in one short transaction, off
the event loop. Agents in the server call it directly; the agent API applies the calls of
`klique agent` through it."""

from __future__ import annotations

import asyncio
import functools
import secrets
from collections.abc import Callable, Sequence

from broker.agents.link import Accepted, Attempt, Begun
from broker.control.held import HeldTasks
from broker.domain import Estate, Task, TaskState, can_transition
from broker.execution import ACTIVE, HOLDING, Observation, PoolState
from broker.pools.settings import requeues_preempted
from broker.store.identity import token_digest
from broker.store.repository import Move, Store


def _may_move(old: TaskState, seen: Observation) -> bool:
    back = old is TaskState.RUNNING and seen.state is TaskState.PENDING and not seen.requeued
    return can_transition(old, seen.state) and not back


class StoreLink:
    """The control plane's own side: every call one short transaction, off the event loop."""

    def __init__(
        self,
        store: Store,
        estate: Estate,
        held: HeldTasks | None = None,
        term: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.store = store
        self.estate = estate
        self.held = held or HeldTasks(store, HOLDING)  # what the pools' looks and the cycles read
        self.term = term  # the leader's term its submissions carry; None: not fenced

    def fenced(self, term: Callable[[], int | None]) -> StoreLink:
        """The same link for the in-server agents of a replica: a begun attempt and an
        accepted job are written only while `term()` is still the lease's
        (broker/control/lease.py)."""
        return StoreLink(self.store, self.estate, self.held, term)

    async def holding(self, pool: str) -> list[Task]:
        return await asyncio.to_thread(self.held.current, pool)

    async def begin(self, attempts: Sequence[Attempt]) -> list[Begun | None]:
        # A new token for every attempt: the one an earlier attempt had stops working here.
        tokens = {a.task.id: secrets.token_urlsafe(32) for a in attempts}
        fields = {
            a.task.id: {"job_dir": a.job_dir, "report_digest": token_digest(tokens[a.task.id])}
            for a in attempts
        }
        placed = [TaskState.PLACED]
        write = functools.partial(self.store.update_many, term=self.term())
        begun = await asyncio.to_thread(write, fields, placed)
        found = {task.id: Begun(task, tokens[task.id]) for task in begun}
        return [found.get(a.task.id) for a in attempts]

    async def submitted(self, accepted: Sequence[Accepted]) -> list[bool]:
        fields = {a.task.id: {"native_id": a.native_id, "job_dir": a.job_dir} for a in accepted}

        term = self.term()

        def write() -> set[int]:
            placed = [TaskState.PLACED]
            moved = self.store.change_states(
                fields, TaskState.SUBMITTED, "", placed, fields, term=term
            )
            done = {task.id for task in moved}
            # Cancelled while the pool was accepting them: keep where their jobs are.
            left = {task_id: own for task_id, own in fields.items() if task_id not in done}
            if left:
                self.store.update_many(left, term=term)
            return done

        done = await asyncio.to_thread(write)
        return [a.task.id in done for a in accepted]

    async def observed(self, news: Sequence[tuple[Task, Observation]]) -> None:
        moves = []
        for task, seen in news:
            if task.state is TaskState.PLACED:
                await self._adopt(task, seen)
            elif seen.state.final and (seen.retry or self._requeues(task, seen)):
                reason = f"{seen.reason}; requeued"
                await self.requeue(task, reason, skip=False, only_from=HOLDING)
            else:
                extra = {"exit_code": seen.exit_code} if seen.exit_code is not None else {}
                # The listing may be older than a runner's own report (pending after running):
                # only a move the state machine allows from where the task is now is made, and
                # a running task goes back to pending only when the scheduler requeued its job.
                only_from = [s for s in ACTIVE if _may_move(s, seen)]
                moves.append(Move(task.id, seen.state, seen.reason, only_from, seen.charged, extra))
        if moves:
            await asyncio.to_thread(self.store.move_each, moves)

    async def _adopt(self, task: Task, seen: Observation) -> None:
        """A placed task whose submission's outcome was unknown: found, or safe to resubmit."""
        if seen.state is TaskState.QUEUED:
            await self.requeue(task, seen.reason, skip=False, only_from=[TaskState.PLACED])
        else:
            await self.submitted([Accepted(task, seen.native_id, seen.job_dir)])

    def _requeues(self, task: Task, seen: Observation) -> bool:
        """Preempted runs go back to the queue: reclaimed by Klique, or by the pool if it says."""
        if task.preempted:
            return True
        pool = self.estate.pools.get(task.pool or "")
        return bool(seen.preempted and pool and requeues_preempted(pool))

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
            report_digest="",  # the attempt is over: its token reports nothing more
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
