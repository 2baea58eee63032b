"""The control loop the server runs (`ControlLoop`): pure placement (broker/scheduler/) on its
own loop, over the latest snapshot each pool's agent published. It never waits for a pool: it
writes what it decided (placed, withdraw, preempt) and wakes the pools' agents, which act on
their own cadence (broker/agents/pool_agent.py). It builds the server's agents with the one
factory (broker/agents/factory.py) and keeps what `klique agent`s publish (RemotePool).

With replicas (PostgreSQL), the loop and the in-server agents run only while this replica
holds the scheduler's lease (broker/control/lease.py), and what they write to act on the
estate carries the term they run under: the store refuses it once another replica leads.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.agents.factory import build_agent
from broker.agents.pool_agent import PoolAgent
from broker.agents.wire import pool_state_from_json, pool_state_to_json
from broker.control.lease import Leadership, readiness
from broker.control.queue import QueueCache
from broker.control.store_link import StoreLink
from broker.domain import Estate, Task, TaskState
from broker.errors import Fenced, KliqueError
from broker.execution import ACTIVE, HOLDING, PoolState
from broker.metrics import CYCLE_SECONDS
from broker.pools.base import PoolDriver
from broker.pools.settings import poll_interval_s, serves_remotely
from broker.scheduler.model import active_of
from broker.scheduler.placement import (
    PendingCode,
    PendingReason,
    QueuedTask,
    SchedulerInput,
    SchedulerSettings,
    UsageRow,
    decayed_usage,
    place,
)
from broker.scheduler.reasons import pool_queue_reasons
from broker.store.leases import LeaseStore, LeaseView
from broker.store.pool_reports import PoolReport, reports, save_report
from broker.store.repository import Store

log = logging.getLogger("klique.scheduler")

_USAGE_HORIZON = 10  # half-lives of ledger history that still count for fair share
_CANCEL_WAIT_S = 20.0  # how long a cancel request waits for the pool to confirm it
_REST = 4.0  # after a cycle, the next waits at least this many times its length
_MOST_REST_S = 5.0  # and never longer than this
_PLACED_PER_WRITE = 1000  # a cycle's placements written in transactions of this many


@dataclass
class RemotePool:
    """A pool served by `klique agent` on its login node: what its agent last published."""

    name: str
    interval_s: float
    state: PoolState = field(default_factory=lambda: PoolState("", reachable=False))
    seen: float | None = None  # when its agent last reported
    strangers: set[str] = field(default_factory=set)

    def snapshot(self) -> PoolState:
        silent = self.seen is None or time.time() - self.seen > max(30.0, 3 * self.interval_s)
        if not silent:
            return self.state
        since = (
            "never" if self.seen is None else time.strftime("%H:%M:%S", time.localtime(self.seen))
        )
        return PoolState(
            self.name,
            reachable=False,
            reason=f"its agent (klique agent --pool {self.name}) has not reported since {since}",
            last_good=self.state.last_good,
            looks=self.state.looks,  # its counts stay what it last said: counters never go back
            status_queries=self.state.status_queries,
        )


@dataclass
class ControlLoop:
    store: Store
    estate: Estate
    drivers: dict[str, PoolDriver]
    home: Path
    interval_s: float = 0.5
    pending: dict[int, PendingReason] = field(default_factory=dict)
    pool_states: dict[str, PoolState] = field(default_factory=dict)
    cycles: int = 0
    agents: dict[str, PoolAgent] = field(default_factory=dict)
    remote: dict[str, RemotePool] = field(default_factory=dict)
    # The scheduler's lease, with replicas; None: one server (SQLite), which leads for life.
    leadership: Leadership | None = None
    term: int | None = None  # the term the cycles and the in-server agents run under
    # Housekeeping the leader does after each cycle (each paces itself): the retention of
    # archived runs (broker/tasks/keeping.py), added where the app is composed.
    chores: list[Callable[[], object]] = field(default_factory=list)
    _checked: bool = False  # the pools' start-up checks ran (at this replica's first term)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _loop: asyncio.AbstractEventLoop | None = None

    def __post_init__(self) -> None:
        self.link = StoreLink(self.store, self.estate)  # the agent API's: remote agents
        # The in-server agents' own: their submissions carry this replica's term.
        own = self.link.fenced(lambda: self.term)
        self.queue = QueueCache(self.store)
        for name, pool in self.estate.pools.items():
            if serves_remotely(pool):
                self.remote[name] = RemotePool(name, poll_interval_s(pool) or self.interval_s)
            elif name in self.drivers:
                self.agents[name] = build_agent(pool, self.drivers[name], own, self.interval_s)

    def readiness(self) -> dict[str, Any]:
        """What /readyz shows: whether the store answers, this replica's role and the lease.
        Blocking: call it from a thread. One server (SQLite) leads for life, with no lease."""
        leadership = self.leadership
        leases = leadership.leases if leadership is not None else LeaseStore(self.store.engine)
        try:
            view: LeaseView | None = leases.read()
        except Exception:  # unreachable, whatever the driver's words: /readyz says so alone
            view = None
        if leadership is None:
            return readiness(view, None, True) | {"term": None, "holder": None}
        return readiness(view, leadership.replica, leadership.leading())

    def leads(self) -> bool:
        """Whether this replica runs the cycles and the in-server agents now."""
        return self.leadership is None or self.leadership.leading()

    def wake(self) -> None:
        """Place again now (a task was submitted or cancelled); safe from any thread."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    def heard(self) -> None:
        """Another replica wrote tasks (broker/store/notify.py): place, and let the pools'
        agents look (a cancel's intent), now; safe from any thread."""
        self.wake()
        if self._loop is not None and self.leads():
            for agent in self.agents.values():
                self._loop.call_soon_threadsafe(agent.wake)

    def wake_pool(self, pool: str | None) -> None:
        """Tell a pool's agent to look now; safe from any thread."""
        agent = self.agents.get(pool or "")
        if agent is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(agent.wake)

    async def run(self, stop: asyncio.Event) -> None:
        """Lead until `stop`: for life on one server; with replicas, for each term this
        replica holds the lease, following between terms."""
        self._loop = asyncio.get_running_loop()
        leadership = self.leadership
        if leadership is None:
            await self._lead(stop)
            return
        claims = asyncio.create_task(leadership.run(stop), name="lease")
        while not stop.is_set():
            await _first_of(stop, leadership.gained)
            if stop.is_set():
                break
            self.term = leadership.term
            ending = asyncio.Event()  # this term's end, or the server's
            watch = asyncio.create_task(_first_of(stop, leadership.term_lost, then=ending))
            await self._lead(ending)
            watch.cancel()
        await claims
        await leadership.release()  # after the agents stopped: the next leader need not wait

    async def _lead(self, stop: asyncio.Event) -> None:
        """The cycles and the in-server agents, until `stop`."""
        if not self._checked:
            await self.check_pools()
            self._checked = True
        # Another replica may have led since: the caches read everything at the first cycle.
        self.queue.full_at = self.link.held.full_at = 0.0
        agents = [
            asyncio.create_task(a.run(stop), name=f"agent {n}") for n, a in self.agents.items()
        ]
        while not stop.is_set():
            self._wake.clear()  # a wake during the cycle below runs the next one soon
            started = time.monotonic()
            try:
                await self.cycle()
            except Fenced as exc:  # another replica leads: this term ends at the next claim
                log.warning("placement cycle refused: %s", exc)
            except Exception:  # a bad cycle must never stop the control loop
                log.exception("placement cycle failed; retrying next cycle")
            for chore in self.chores:
                try:
                    await asyncio.to_thread(chore)
                except Exception:  # nor a chore that fails
                    log.exception("housekeeping failed; retrying later")
            CYCLE_SECONDS.observe(time.monotonic() - started)
            # Wakes coalesce: the next cycle waits a few times as long as this one took, so
            # that a long queue's cycles leave the API most of the time, whatever the wakes.
            await asyncio.sleep(min(_REST * (time.monotonic() - started), _MOST_REST_S))
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
            await asyncio.wait(waits, timeout=self.interval_s, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
        await asyncio.gather(*agents, return_exceptions=True)

    async def check_pools(self) -> None:
        """Start-up checks (job roots, interpreters): a pool with problems takes no task."""

        async def check(name: str, driver: PoolDriver) -> None:
            try:
                problems = await asyncio.wait_for(driver.check(), 60)
            except (KliqueError, TimeoutError) as exc:  # unreachable now: its agent will say so
                log.warning("pool %s: start-up check could not run: %s", name, exc)
                return
            for problem in problems:
                log.error("pool %s: %s", name, problem)

        await asyncio.gather(*(check(n, d) for n, d in self.drivers.items()))

    def published(self, pool: str, state: PoolState, strangers: set[str]) -> None:
        """A `klique agent`'s report of its pool; with replicas, kept in the store too, for
        the leader (the agent may report to any replica). Blocking: call it from a thread."""
        remote = self.remote[pool]
        remote.state, remote.strangers, remote.seen = state, strangers, time.time()
        if self.leadership is not None:
            as_json = json.dumps(pool_state_to_json(state))
            report = PoolReport(pool, as_json, json.dumps(sorted(strangers)), remote.seen)
            save_report(self.store, report)

    def _remote_reports(self) -> None:
        """With replicas, every remote pool's latest report, whichever replica it reached."""
        if self.leadership is None or not self.remote:
            return
        for report in reports(self.store):
            remote = self.remote.get(report.pool)
            if remote is not None and (remote.seen is None or report.seen > remote.seen):
                state = pool_state_from_json({**json.loads(report.state), "name": report.pool})
                remote.state, remote.seen = state, report.seen
                remote.strangers = set(json.loads(report.strangers))

    def snapshots(self) -> dict[str, PoolState]:
        """Every pool's latest published state: placement reads these, never waits for them."""
        self._remote_reports()
        states = {name: agent.state() for name, agent in self.agents.items()}
        states.update({name: pool.snapshot() for name, pool in self.remote.items()})
        return states

    def why(self, task: Task) -> PendingReason | None:
        """Why a task waits, or None when it does not: the last cycle's reason for a queued
        task; for one in a pool's queue, the pool's word as it is now (the task may have got
        there, or its pool may have said more, since that cycle)."""
        if task.state is TaskState.QUEUED:
            return self.pending.get(task.id)
        if task.state is TaskState.PLACED:
            return self._outcome_unknown(task)
        if task.state not in (TaskState.SUBMITTED, TaskState.PENDING):
            return None
        withdrawn = {task.id} if task.intent == "withdraw" else set()
        return pool_queue_reasons(self.estate, [active_of(task, time.time())], withdrawn)[task.id]

    def _outcome_unknown(self, task: Task) -> PendingReason | None:
        """A placed task whose submission's reply was lost: looked for before it goes again."""
        driver = self.drivers.get(task.pool or "")
        remote = self.remote.get(task.pool or "")
        if remote is not None:  # its agent's last word: this server holds no driver for it
            words = remote.state.outcome_unknown.get(task.id)
        else:
            words = driver.outcome_unknown(task.id) if driver is not None else None
        return PendingReason(PendingCode.OUTCOME_UNKNOWN, words) if words else None

    def strangers(self, pool: str) -> set[str]:
        if pool in self.remote:
            return self.remote[pool].strangers
        driver = self.drivers.get(pool)
        return driver.strangers if driver is not None else set()

    async def cycle(self) -> None:
        queued = await asyncio.to_thread(self.queue.current)
        holding = await asyncio.to_thread(self.link.held.current)
        self.pool_states = await asyncio.to_thread(self.snapshots)
        await self._place(queued, holding)
        self.cycles += 1

    async def _place(self, queued: Sequence[QueuedTask], holding: Sequence[Task]) -> None:
        now = time.time()
        usage = await asyncio.to_thread(self._usage, now) if queued else {}
        out = await asyncio.to_thread(  # off the event loop: a long queue takes a while
            place,
            SchedulerInput(
                estate=self.estate,
                queued=list(queued),
                active=[active_of(t, now) for t in holding],
                pools=self.pool_states,
                usage=usage,  # fair share orders only the queue
                now=now,
                settings=SchedulerSettings(
                    min_run_s=self.estate.min_run_s,
                    grace_s=self.estate.reclaim_grace_s,
                    max_preemptions_per_cycle=self.estate.max_preemptions_per_cycle,
                    starvation_s=self.estate.starvation_s,
                ),
            ),
        )
        self.pending = out.pending
        attempts = self.queue.attempts
        by_id = {t.id: t for t in holding}
        woken: set[str | None] = set()
        for task_id in out.withdrawals:
            task = by_id.get(task_id)
            if task is not None and task.state in (TaskState.SUBMITTED, TaskState.PENDING):
                withdraw = {task.id: {"intent": "withdraw"}}
                await asyncio.to_thread(self.store.update_many, withdraw, term=self.term)
                woken.add(task.pool)
        for task_id in out.preemptions:
            task = by_id.get(task_id)
            if task is not None and task.state in ACTIVE and not task.preempted:
                reason = "preempted to return a reservation"
                preempt = {task.id: {"preempted": True, "reason": reason}}
                await asyncio.to_thread(self.store.update_many, preempt, term=self.term)
                woken.add(task.pool)
        fields = {
            d.task_id: {
                "pool": d.pool,
                "borrowed": d.borrowed,
                "gpu_ids": list(d.gpus),
                "attempts": attempts.get(d.task_id, 0) + 1,
                "job_dir": None,
            }
            for d in out.placements
        }
        ids = list(fields)
        for start in range(0, len(ids), _PLACED_PER_WRITE):  # one transaction per thousand
            chunk = ids[start : start + _PLACED_PER_WRITE]
            placed = await asyncio.to_thread(
                functools.partial(self.store.change_states, term=self.term),
                chunk,
                TaskState.PLACED,
                "",
                [TaskState.QUEUED],
                fields,
            )
            woken.update(task.pool for task in placed)
            for task in placed:
                log.info(
                    "task %s placed on pool %s",
                    task.id,
                    task.pool,
                    extra={"task_id": task.id, "pool": task.pool},
                )
        for pool in woken:
            self.wake_pool(pool)

    def _usage(self, now: float) -> dict[str, float]:
        half_life = self.estate.fair_share_half_life_s
        rows = [
            UsageRow(r.team or "", r.start, r.end, r.gpus)
            for r in self.store.ledger(since=now - _USAGE_HORIZON * half_life)
        ]
        return decayed_usage(rows, now, half_life)

    async def cancel(self, task: Task, wait_s: float = _CANCEL_WAIT_S) -> Task:
        """Cancel a task wherever it is; one not yet in a pool never reaches it. One in a pool is
        its agent's to stop: this asks, then waits up to `wait_s` for the pool to confirm."""
        early = (TaskState.CREATED, TaskState.QUEUED, TaskState.HELD, TaskState.PLACED)
        reason = "cancelled by its owner"
        done = await asyncio.to_thread(
            self.store.change_state, task.id, TaskState.CANCELLED, reason, only_from=early
        )
        if done is not None:
            return done
        if task.pool not in self.agents and task.pool not in self.remote:
            # No agent stops it (a run the SDK recorded where it started): the record ends here.
            done = await asyncio.to_thread(
                self.store.change_state, task.id, TaskState.CANCELLED, reason, only_from=HOLDING
            )
            return done if done is not None else await asyncio.to_thread(self.store.get, task.id)
        await asyncio.to_thread(self.store.update, task.id, intent="cancel")
        self.wake_pool(task.pool)
        deadline = time.monotonic() + wait_s
        while True:
            current = await asyncio.to_thread(self.store.get, task.id)
            if current.state.final or time.monotonic() >= deadline:
                return current
            await asyncio.sleep(0.05)


async def _first_of(a: asyncio.Event, b: asyncio.Event, then: asyncio.Event | None = None) -> None:
    """Wait until either event is set; then set `then`, where given."""
    waits = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    if then is not None:
        then.set()
