"""The scheduler cycle: read the store, ask the pools, place, submit, write back.

No submission is in flight between two cycles, so a task found PLACED at the start of a
cycle is one whose submission's outcome is unknown (a timeout, a crash): its pool looks its
tag up before anything is submitted again.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from broker.domain import Estate, Task, TaskState, can_transition
from broker.errors import KliqueError, SubmitUnknown, TransportError
from broker.faults import crash_point
from broker.pools.base import Observation, PoolDriver
from broker.scheduler.placement import (
    ActiveTask,
    PendingReason,
    PoolState,
    QueuedTask,
    SchedulerInput,
    SchedulerSettings,
    UsageRow,
    decayed_usage,
    place,
)
from broker.store.repository import Store, token_digest

log = logging.getLogger("klique.scheduler")

ACTIVE = (TaskState.SUBMITTED, TaskState.PENDING, TaskState.RUNNING)
HOLDING = (TaskState.PLACED, *ACTIVE)
_USAGE_HORIZON = 10  # half-lives of ledger history that still count for fair share


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
    _loop: asyncio.AbstractEventLoop | None = None
    # Tasks whose cancel is under way: the end their pool sees meanwhile (the runner's report
    # of the signal) is the cancel's, recorded by cancel() itself.
    _cancelling: set[int] = field(default_factory=set)

    def wake(self) -> None:
        """Run the next cycle now (a task was submitted or cancelled); safe from any thread."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    async def run(self, stop: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        await self.check_pools()
        while not stop.is_set():
            self._wake.clear()  # a wake during the cycle below runs the next one at once
            try:
                await self.cycle()
            except Exception:  # a bad cycle must never stop the scheduler
                log.exception("scheduler cycle failed; retrying next cycle")
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
            await asyncio.wait(waits, timeout=self.interval_s, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()

    async def check_pools(self) -> None:
        """Start-up checks (job roots, interpreters): a pool with problems takes no task."""

        async def check(name: str, driver: PoolDriver) -> None:
            try:
                problems = await driver.check()
            except KliqueError as exc:  # unreachable now: its polls will say so
                log.warning("pool %s: start-up check could not run: %s", name, exc)
                return
            for problem in problems:
                log.error("pool %s takes no task: %s", name, problem)

        await asyncio.gather(*(check(n, d) for n, d in self.drivers.items()))

    async def cycle(self) -> None:
        holding = self._by_pool(self.store.tasks(states=HOLDING))
        await asyncio.gather(*(self._follow(name, tasks) for name, tasks in holding.items()))
        holding = self._by_pool(self.store.tasks(states=HOLDING))
        states = await asyncio.gather(
            *(self._capacity(name, tasks) for name, tasks in holding.items())
        )
        self.pool_states = {s.name: s for s in states}
        await self._place(
            self.store.tasks(states=[TaskState.QUEUED]),
            [t for tasks in holding.values() for t in tasks],
        )
        self.cycles += 1

    def _by_pool(self, tasks: Sequence[Task]) -> dict[str, list[Task]]:
        grouped: dict[str, list[Task]] = {name: [] for name in self.drivers}
        for task in tasks:
            if task.pool in grouped:
                grouped[task.pool].append(task)
        return grouped

    # Following what pools say.

    async def _follow(self, pool: str, tasks: Sequence[Task]) -> None:
        if not tasks:
            return
        try:
            news = await self.drivers[pool].poll(tasks)
        except KliqueError as exc:  # a failing status query never fails a task
            log.warning("pool %s: status query failed: %s", pool, exc)
            return
        crash_point("after_poll")
        by_id = {t.id: t for t in tasks}
        for task_id, seen in news.items():
            self._apply(by_id[task_id], seen)

    def _apply(self, task: Task, seen: Observation) -> None:
        if task.id in self._cancelling:
            return
        if task.state is TaskState.PLACED:
            self._adopt(task, seen)
        elif seen.state.final and self._requeues(task, seen):
            self._requeue(task, f"{seen.reason}; requeued", skip=False)
        else:
            extra = {"exit_code": seen.exit_code} if seen.exit_code is not None else {}
            # The listing may be older than a runner's own report (pending after running):
            # only a move the state machine allows from where the task is now is made.
            moves = [s for s in ACTIVE if can_transition(s, seen.state)]
            self.store.change_state(
                task.id, seen.state, seen.reason or None, only_from=moves, **extra
            )

    def _adopt(self, task: Task, seen: Observation) -> None:
        """A PLACED task whose submission's outcome was unknown: found, or safe to resubmit."""
        if seen.state is TaskState.QUEUED:
            self._requeue(task, seen.reason, skip=False, only_from=[TaskState.PLACED])
            return
        log.info("task %s: found its job %s in pool %s", task.id, seen.native_id, task.pool)
        self._submitted(task, seen.native_id, seen.job_dir)

    def _submitted(self, task: Task, native_id: str | None, job_dir: str | None) -> Task | None:
        """The pool accepted the task; None when it was cancelled meanwhile."""
        return self.store.change_state(
            task.id,
            TaskState.SUBMITTED,
            "",
            only_from=[TaskState.PLACED],
            native_id=native_id,
            job_dir=job_dir,
        )

    def _requeues(self, task: Task, seen: Observation) -> bool:
        """Preempted runs go back to the queue: reclaimed by Klique, or by the pool if it says."""
        if task.preempted:
            return True
        pool = self.estate.pools.get(task.pool or "")
        return bool(seen.preempted and pool and pool.settings.get("requeue_preempted"))

    def _requeue(
        self,
        task: Task,
        reason: str,
        *,
        skip: bool,
        only_from: Sequence[TaskState] = (*ACTIVE, TaskState.PLACED),
    ) -> None:
        skip_pools = task.skip_pools | ({task.pool} if skip and task.pool else set())
        self.store.change_state(
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

    async def _capacity(self, pool: str, tasks: Sequence[Task]) -> PoolState:
        try:
            return await self.drivers[pool].capacity([t for t in tasks if t.state in ACTIVE])
        except KliqueError as exc:
            return PoolState(pool, reachable=False, reason=str(exc))

    # Placing.

    async def _place(self, queued: Sequence[Task], holding: Sequence[Task]) -> None:
        now = time.time()
        out = place(
            SchedulerInput(
                estate=self.estate,
                queued=[
                    QueuedTask(
                        t.id, t.owner, t.team, t.resource, t.queued_at or t.created_at, t.skip_pools
                    )
                    for t in queued
                ],
                active=[_active(t, now) for t in holding],
                pools=self.pool_states,
                usage=self._usage(now) if queued else {},  # fair share orders only the queue
                now=now,
                settings=SchedulerSettings(
                    min_run_s=self.estate.min_run_s,
                    grace_s=self.estate.reclaim_grace_s,
                    max_preemptions_per_cycle=self.estate.max_preemptions_per_cycle,
                    starvation_s=self.estate.starvation_s,
                ),
            )
        )
        self.pending = out.pending
        by_id = {t.id: t for t in (*queued, *holding)}
        await asyncio.gather(*(self._withdraw(by_id[i]) for i in out.withdrawals if i in by_id))
        await asyncio.gather(*(self._preempt(by_id[i]) for i in out.preemptions if i in by_id))
        placed = []
        for decision in out.placements:
            task = self.store.change_state(
                decision.task_id,
                TaskState.PLACED,
                "",
                only_from=[TaskState.QUEUED],
                pool=decision.pool,
                borrowed=decision.borrowed,
                gpu_ids=list(decision.gpus),
                attempts=by_id[decision.task_id].attempts + 1,
            )
            if task is not None:
                placed.append(task)
        await self._submit_all(placed)

    def _usage(self, now: float) -> dict[str, float]:
        half_life = self.estate.fair_share_half_life_s
        rows = [
            UsageRow(r.team or "", r.start, r.end, r.gpus)
            for r in self.store.ledger(since=now - _USAGE_HORIZON * half_life)
        ]
        return decayed_usage(rows, now, half_life)

    async def _submit_all(self, placed: Sequence[Task]) -> None:
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
        # A new folder and report token for every attempt, recorded before anything is sent:
        # a crash after this finds the job by its folder, and an old attempt cannot report.
        token = secrets.token_urlsafe(32)
        task = self.store.update(
            task.id, job_dir=driver.new_job_dir(task), report_digest=token_digest(token)
        )
        crash_point("before_submit")
        try:
            done = await driver.submit(task, token)
        except SubmitUnknown as exc:
            log.warning("task %s: submission outcome unknown: %s", task.id, exc)
            return  # stays PLACED: the next cycle looks its tag up before any retry
        except TransportError as exc:  # nothing was submitted: try again when it is back
            self._requeue(
                task,
                f"pool {task.pool} unreachable: {exc}",
                skip=False,
                only_from=[TaskState.PLACED],
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
        crash_point("after_submit")
        if (
            self._submitted(task, done.native_id, done.job_dir) is None
        ):  # cancelled while the pool was accepting it
            await driver.cancel(
                self.store.update(task.id, native_id=done.native_id, job_dir=done.job_dir)
            )

    async def _withdraw(self, task: Task) -> None:
        """Spill-over: take a task that waited too long out of its pool, try the next one."""
        if task.state not in (TaskState.SUBMITTED, TaskState.PENDING):
            return
        try:
            await self.drivers[task.pool or ""].cancel(task)
        except KliqueError as exc:
            log.warning("task %s: could not withdraw it from %s: %s", task.id, task.pool, exc)
            return
        self._requeue(
            task,
            f"waited past max_wait in {task.pool}; trying the next pool",
            skip=True,
            only_from=[TaskState.SUBMITTED, TaskState.PENDING],
        )

    async def _preempt(self, task: Task) -> None:
        """Reclaim: stop a borrowed run; it is requeued when its pool reports it ended."""
        if task.state not in ACTIVE or task.preempted:
            return
        self.store.update(task.id, preempted=True, reason="preempted to return a reservation")
        try:
            await self.drivers[task.pool or ""].preempt(task)
        except KliqueError as exc:
            log.warning("task %s: could not preempt it: %s", task.id, exc)

    async def cancel(self, task: Task) -> Task:
        """Cancel a task wherever it is; one still queued in Klique never reaches a pool."""
        early = (TaskState.CREATED, TaskState.QUEUED, TaskState.HELD, TaskState.PLACED)
        reason = "cancelled by its owner"
        done = self.store.change_state(task.id, TaskState.CANCELLED, reason, only_from=early)
        if done is not None:
            return done
        if task.state in ACTIVE and task.pool in self.drivers:
            self._cancelling.add(task.id)
            try:
                await self.drivers[task.pool].cancel(task)
            finally:
                self._cancelling.discard(task.id)
        done = self.store.change_state(task.id, TaskState.CANCELLED, reason, only_from=ACTIVE)
        return done or self.store.get(task.id)


def _active(task: Task, now: float) -> ActiveTask:
    running = task.state is TaskState.RUNNING
    since = (task.started_at if running else task.submitted_at) or now
    return ActiveTask(
        task.id,
        task.owner,
        task.team,
        task.resource,
        task.pool or "",
        running,
        since,
        borrowed=task.borrowed,
        gpus=task.gpu_ids,
        preempted=task.preempted,
        skip_pools=task.skip_pools,
        native_reason=task.reason,
    )
