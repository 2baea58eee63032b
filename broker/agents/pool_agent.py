"""One pool's agent: follows the pool's tasks, publishes its capacity, submits what placement
gave it and carries out cancels, withdrawals and preemptions, on its own cadence.

Agents never wait for each other, and placement never waits for an agent: it reads the latest
snapshot. A failure of any kind in one pool (a hung command, an exception from a parser) stays
in that agent: it is logged once, shown by `klique pools` with the time of the last good
answer, and retried with backoff. The same class runs inside the server and in `klique agent`
on a login node; only its ControlPlane differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from broker.agents.link import Accepted, Attempt, ControlPlane
from broker.agents.timing import PoolClock
from broker.domain import Task, TaskState
from broker.errors import KliqueError, SubmitUnknown, TransportError
from broker.execution import ACTIVE, Observation, PoolState, Submission
from broker.faults import crash_point
from broker.pools.base import PoolDriver

log = logging.getLogger("klique.agent")

STEP_TIMEOUT_S = 120.0  # one look at the pool, however its commands hang
OPERATION_TIMEOUT_S = 180.0  # one submission, cancel or preemption
_REST = 1.0  # after a look, the next waits at least this many times its length
_MOST_REST_S = 2.0  # and never longer than this


class PoolAgent:
    """One pool's agent: its looks, its operations, its clock (broker/agents/timing.py). Built
    by broker/agents/factory.py, in the server and in `klique agent` alike."""

    def __init__(
        self,
        name: str,
        driver: PoolDriver,
        link: ControlPlane,
        interval_s: float,
        submit_concurrency: int = 8,
    ) -> None:
        self.name = name
        self.driver = driver
        self.link = link
        self.interval_s = interval_s
        self.snapshot = PoolState(name, reachable=False, reason="not polled yet")
        self.last_good: float | None = None  # wall-clock time of the last good look
        self.looks = 0
        self.status_queries = 0  # one per look at most, whatever the number of tasks
        self._failure = ""  # the reason of the current run of failures, logged once
        # The pool's one clock: its looks, its status queries, its claimed ends.
        self.clock = PoolClock(interval_s, driver.query_interval_s)
        self._unconfirmed: frozenset[int] = frozenset()  # claims the last look did not confirm
        self._wake = asyncio.Event()
        self._busy: set[int] = set()  # tasks with an operation under way (submit, cancel...)
        self._preempted: set[int] = set()  # asked to stop once already
        self._operations: set[asyncio.Task[None]] = set()
        self.submit_concurrency = submit_concurrency  # submissions in flight at once
        self._slots = asyncio.Semaphore(submit_concurrency)

    def wake(self) -> None:
        """Look again now (new placements or intents); call on the agent's event loop."""
        self._wake.set()

    def state(self) -> PoolState:
        """The latest snapshot, with how old its last good answer is."""
        return self.snapshot

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._wake.clear()
            started = time.monotonic()
            await self.step()
            # Wakes coalesce: a look reads every task the pool holds, so while reports and
            # placements stream in, looks rest as long as they take rather than run back to back.
            await asyncio.sleep(min(_REST * (time.monotonic() - started), _MOST_REST_S))
            delay = self.clock.next_look_in(self._unconfirmed, time.monotonic())
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
            await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
        await self.close()

    async def close(self) -> None:
        for operation in list(self._operations):
            operation.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._operations, return_exceptions=True)

    async def step(self) -> None:
        """One look at the pool, contained: nothing raised here leaves the agent."""
        try:
            await asyncio.wait_for(self._look(), STEP_TIMEOUT_S)
        except Exception as exc:  # any failure: this pool only, logged once, backed off
            reason = _words(exc)
            if reason != self._failure:
                log.warning(
                    "pool %s: %s",
                    self.name,
                    reason,
                    exc_info=not _expected(exc),
                    extra={"pool": self.name},
                )
                self._failure = reason
            self.clock.look_failed()
            self.snapshot = PoolState(
                self.name,
                reachable=False,
                reason=self._unreachable(reason),
                last_good=self.last_good,
                outcome_unknown=self.snapshot.outcome_unknown,  # still unknown: not looked up
            )
            await self._publish()
            return
        if not self.snapshot.reachable:
            return  # the pool said so itself (a failure met on an earlier look, or its checks)
        if self._failure:
            log.info("pool %s answers again", self.name, extra={"pool": self.name})
        self._failure = ""
        self.clock.look_answered()

    def _unreachable(self, reason: str) -> str:
        if self.last_good is None:
            return reason
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.last_good))
        return f"{reason} (last good answer {when})"

    async def _look(self) -> None:
        tasks = [t for t in await self.link.holding(self.name) if t.id not in self._busy]
        self._act_on_intents(tasks)
        fresh = [t for t in tasks if t.state is TaskState.PLACED and t.job_dir is None]
        new = {t.id for t in fresh}
        followed = [t for t in tasks if t.id not in new and not t.intent and t.id not in self._busy]
        news = await self.ask(followed)
        crash_point("after_poll")
        by_id = {t.id: t for t in followed}
        await self.link.observed([(by_id[task_id], seen) for task_id, seen in news.items()])
        self._unconfirmed = _unconfirmed(followed, news)
        active = [t for t in tasks if t.state in ACTIVE]
        state = await self.driver.capacity(active)
        if state.reachable:
            self.last_good = time.time()
        if not state.reachable:
            state = replace(state, reason=self._unreachable(state.reason))
        unknown = {t.id: w for t in tasks if (w := self._outcome_unknown(t))}
        self.snapshot = replace(state, last_good=self.last_good, outcome_unknown=unknown)
        self.looks += 1
        await self._publish()
        for batch in self.driver.batches(fresh):
            self._start_all(batch, self._submit)

    def _outcome_unknown(self, task: Task) -> str | None:
        """Why a placed task waits where its submission's reply was lost (the driver keeps it)."""
        return self.driver.outcome_unknown(task.id) if task.state is TaskState.PLACED else None

    async def ask(self, followed: list[Task]) -> dict[int, Observation]:
        """The pool's news of the tasks it holds, where its clock says a query is due (no news
        otherwise). Only the pool's own failure to answer backs its queries off."""
        now = time.monotonic()
        claimed = frozenset(t.id for t in followed if t.claim is not None)
        if not self.clock.query_due(claimed, now):
            return {}
        self.clock.queried(claimed, now)
        self.status_queries += 1
        try:
            news = await self.driver.poll(followed)
        except KliqueError:
            self.clock.unanswered()
            raise
        self.clock.answered()
        return news

    async def _publish(self) -> None:
        self.snapshot = replace(self.snapshot, looks=self.looks, status_queries=self.status_queries)
        with contextlib.suppress(KliqueError):
            await self.link.published(self.name, self.snapshot, sorted(self.driver.strangers))

    def _act_on_intents(self, tasks: list[Task]) -> None:
        for task in tasks:
            if task.intent == "cancel":
                self._start(task, self._cancel)
            elif task.intent == "withdraw":
                self._start(task, self._withdraw)
            elif task.preempted and task.state in ACTIVE and task.id not in self._preempted:
                self._preempted.add(task.id)
                self._start(task, self._preempt)

    def _start(self, task: Task, operation: Callable[[Task], Awaitable[None]]) -> None:
        """Run one operation on one task in the background, bounded in time, one at a time."""
        self._start_all([task], lambda tasks: operation(tasks[0]))

    def _start_all(
        self, tasks: list[Task], operation: Callable[[list[Task]], Awaitable[None]]
    ) -> None:
        """The same for an operation on several tasks at once (a batch of submissions)."""
        tasks = [t for t in tasks if t.id not in self._busy]
        if not tasks:
            return
        ids = {t.id for t in tasks}
        self._busy |= ids

        async def guarded() -> None:
            try:
                await asyncio.wait_for(operation(tasks), OPERATION_TIMEOUT_S)
            except Exception as exc:
                shown = ", ".join(str(t.id) for t in tasks)
                log.warning("pool %s: task %s: %s", self.name, shown, _words(exc))
            finally:
                self._busy -= ids

        job = asyncio.get_running_loop().create_task(guarded())
        self._operations.add(job)
        job.add_done_callback(self._operations.discard)

    # Operations.

    async def _submit(self, tasks: list[Task]) -> None:
        async with self._slots:
            await self._submit_now(tasks)

    async def _submit_now(self, tasks: list[Task]) -> None:
        # A new folder for every attempt, recorded before anything is sent, with the report
        # token the control plane makes for it: a crash after this finds the job by its
        # folder, and an old attempt cannot report.
        attempts = [Attempt(task, self.driver.new_job_dir(task)) for task in tasks]
        found = await self.link.begin(attempts)
        # A task no longer placed was cancelled meanwhile: nothing is sent for it.
        begun = [(b.task, b.token) for b in found if b is not None]
        for _ in begun:  # counted per task: every task of the batch is begun, none is sent
            crash_point("before_submit")
        if not begun:
            return
        outcomes = await self.driver.submit_many(begun)
        accepted: list[Accepted] = []
        for (task, _token), outcome in zip(begun, outcomes, strict=True):
            if isinstance(outcome, Submission):
                accepted.append(Accepted(task, outcome.native_id, outcome.job_dir))
                continue
            try:
                await self._not_submitted(task, outcome)
            except Exception as exc:  # one task's record: the others are recorded still
                log.warning(
                    "pool %s: task %s: %s", self.name, task.id, _words(exc), extra=_ids(self, task)
                )
        for _ in accepted:  # counted per task: the pool has every job, the store none
            crash_point("after_submit")
        if not accepted:
            return
        recorded = await self.link.submitted(accepted)
        for (task, native_id, _job_dir), kept in zip(accepted, recorded, strict=True):
            if kept:
                log.info(
                    "pool %s: task %s submitted as job %s",
                    self.name,
                    task.id,
                    native_id,
                    extra={**_ids(self, task), "native_id": native_id},
                )
                continue
            try:  # cancelled while the pool was accepting it
                await self.driver.cancel(replace(task, native_id=native_id))
            except Exception as exc:  # one task's cancel: the others are cancelled still
                log.warning(
                    "pool %s: task %s: %s", self.name, task.id, _words(exc), extra=_ids(self, task)
                )

    async def _not_submitted(self, begun: Task, outcome: Exception) -> None:
        """Record how one task's submission failed."""
        if isinstance(outcome, SubmitUnknown):
            log.warning(
                "task %s: submission outcome unknown: %s",
                begun.id,
                outcome,
                extra=_ids(self, begun),
            )
            return  # stays placed, with its folder: the next look finds its job or resubmits
        if isinstance(outcome, TransportError):  # nothing was submitted: try again when back
            await self.link.requeue(
                begun,
                f"pool {self.name} unreachable: {outcome}",
                skip=False,
                only_from=[TaskState.PLACED],
            )
            return
        if isinstance(outcome, KliqueError):  # refused: the pool's words, an unmapped user...
            await self.link.refused(begun, f"refused by pool {self.name}: {outcome}")
            return
        raise outcome  # not the pool's answer (a fault of Klique's): stays placed

    async def _cancel(self, task: Task) -> None:
        await self.driver.cancel(task)
        await self.link.cancelled(task, "cancelled by its owner")

    async def _withdraw(self, task: Task) -> None:
        """Spill-over: take a task that waited too long out of its pool, try the next one."""
        await self.driver.cancel(task)
        await self.link.requeue(
            task,
            f"waited past max_wait in {self.name}; trying the next pool",
            skip=True,
            only_from=[TaskState.SUBMITTED, TaskState.PENDING],
        )

    async def _preempt(self, task: Task) -> None:
        """Reclaim: stop a borrowed run; it is requeued when its pool reports it ended."""
        await self.driver.preempt(task)


def _unconfirmed(followed: list[Task], news: dict[int, Observation]) -> frozenset[int]:
    """The tasks whose runner claimed an end that this look did not see."""
    return frozenset(
        t.id
        for t in followed
        if t.claim is not None and not (t.id in news and news[t.id].state.final)
    )


def _words(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {STEP_TIMEOUT_S:g} s"
    if isinstance(exc, KliqueError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _expected(exc: BaseException) -> bool:
    """Failures of the pool itself; anything else is a bug worth its traceback (once)."""
    return isinstance(exc, KliqueError | TimeoutError)


def _ids(agent: PoolAgent, task: Task) -> dict[str, object]:
    """A log event's ids (logging's `extra`): JSON logs carry them as fields of their own."""
    return {"task_id": task.id, "pool": agent.name}
