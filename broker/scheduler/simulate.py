"""Dry run of a changed estate: one placement cycle over a queue, its active tasks and pool
states, said as "would start on POOL" or "would wait: WHY" per task, with a summary per team.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from broker.domain import Estate, Task
from broker.errors import KliqueError
from broker.execution import PoolState
from broker.scheduler.placement import (
    ActiveTask,
    PendingReason,
    QueuedTask,
    SchedulerInput,
    SchedulerSettings,
    place,
)

NO_TEAM = "(no team)"


@dataclass(frozen=True)
class Verdict:
    """What the cycle would do with one queued task."""

    id: int
    owner: str
    team: str | None
    resource: str
    pool: str | None = None  # would start (or be sent to the pool's own queue) here
    borrowed: bool = False
    waiting: PendingReason | None = None

    @property
    def sentence(self) -> str:
        if self.pool is not None:
            lent = " (on room reserved for another team: may be reclaimed)" if self.borrowed else ""
            return f"would start on {self.pool}{lent}"
        if self.waiting is None:
            return "would wait"
        return f"would wait: {self.waiting.text}"


@dataclass(frozen=True)
class TeamSummary:
    team: str
    tasks: int
    start: int
    wait: int
    pools: dict[str, int] = field(default_factory=dict)  # where its tasks would start
    reasons: dict[str, int] = field(default_factory=dict)  # why the others would wait


@dataclass(frozen=True)
class Simulation:
    verdicts: list[Verdict]
    teams: list[TeamSummary]
    preempted: list[int]  # active tasks reclaim would stop to hand a reservation back
    withdrawn: list[int]  # active tasks spill-over would take out of a pool's queue
    assumed: list[str]  # pools with no recorded state, taken as reachable with nothing free
    queued: int
    active: int
    now: float

    def to_dict(self) -> dict[str, Any]:
        """The JSON form the API returns and `klique policy simulate --json` prints."""
        return {
            "now": self.now,
            "queued": self.queued,
            "active": self.active,
            "tasks": [_verdict_dict(v) for v in self.verdicts],
            "teams": [asdict(t) for t in self.teams],
            "preempted": list(self.preempted),
            "withdrawn": list(self.withdrawn),
            "assumed_pools": list(self.assumed),
        }


def settings_of(estate: Estate) -> SchedulerSettings:
    """The scheduler's knobs as the estate sets them (the loop builds the same)."""
    return SchedulerSettings(
        min_run_s=estate.min_run_s,
        grace_s=estate.reclaim_grace_s,
        max_preemptions_per_cycle=estate.max_preemptions_per_cycle,
        starvation_s=estate.starvation_s,
    )


def queued_of(task: Task) -> QueuedTask:
    """A queued task as the scheduler loop hands it to placement."""
    return QueuedTask(
        task.id,
        task.owner,
        task.team,
        task.resource,
        task.queued_at or task.created_at,
        task.skip_pools,
    )


def simulate(
    estate: Estate,
    queued: Sequence[QueuedTask],
    active: Sequence[ActiveTask],
    pools: Mapping[str, PoolState],
    usage: Mapping[str, float] | None = None,
    now: float = 0.0,
) -> Simulation:
    """One placement cycle under `estate`; nothing is changed anywhere.

    Tasks keep the team they were submitted with. A pool of `estate` with no state in
    `pools` (a new pool) is taken as reachable: a host pool is counted from the estate and
    the active tasks, as the scheduler always does; a queueing pool as having nothing free,
    so tasks go to its queue up to `max_queued`.
    """
    states = dict(pools)
    assumed = [name for name in estate.pools if name not in states]
    states.update({name: PoolState(name) for name in assumed})
    out = place(
        SchedulerInput(
            estate=estate,
            queued=queued,
            active=active,
            pools=states,
            usage=dict(usage or {}),
            now=now,
            settings=settings_of(estate),
        )
    )
    placed = {d.task_id: d for d in out.placements}
    verdicts = []
    for task in sorted(queued, key=lambda t: t.id):
        decision = placed.get(task.id)
        verdicts.append(
            Verdict(
                task.id,
                task.owner,
                task.team,
                task.resource,
                pool=decision.pool if decision else None,
                borrowed=decision.borrowed if decision else False,
                waiting=None if decision else out.pending.get(task.id),
            )
        )
    return Simulation(
        verdicts,
        _teams(verdicts),
        sorted(out.preemptions),
        sorted(out.withdrawals),
        assumed,
        queued=len(queued),
        active=len(active),
        now=now,
    )


def _teams(verdicts: Sequence[Verdict]) -> list[TeamSummary]:
    tally: dict[str, tuple[int, int, dict[str, int], dict[str, int]]] = {}
    for v in verdicts:
        start, wait, pools, reasons = tally.get(v.team or NO_TEAM, (0, 0, {}, {}))
        if v.pool is not None:
            start += 1
            pools[v.pool] = pools.get(v.pool, 0) + 1
        else:
            wait += 1
            code = v.waiting.primary.value if v.waiting else "unknown"
            reasons[code] = reasons.get(code, 0) + 1
        tally[v.team or NO_TEAM] = (start, wait, pools, reasons)
    return [
        TeamSummary(team, start + wait, start, wait, pools, reasons)
        for team, (start, wait, pools, reasons) in sorted(tally.items())
    ]


def _verdict_dict(v: Verdict) -> dict[str, Any]:
    return {
        "id": v.id,
        "owner": v.owner,
        "team": v.team,
        "resource": v.resource,
        "outcome": "start" if v.pool is not None else "wait",
        "pool": v.pool,
        "borrowed": v.borrowed,
        "sentence": v.sentence,
        "reason": v.waiting.primary.value if v.waiting else None,
        "detail": v.waiting.detail if v.waiting else None,
        "pools": dict(v.waiting.pools) if v.waiting else {},
    }


# Traces: a recorded queue, active tasks and pool states, replayed without a server.


class _TraceModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _QueuedIn(_TraceModel):
    id: int
    owner: str
    team: str | None = None
    resource: str
    queued_at: float
    skip_pools: list[str] = []


class _ActiveIn(_TraceModel):
    id: int
    owner: str
    team: str | None = None
    resource: str
    pool: str
    running: bool = True
    since: float
    borrowed: bool = False
    gpus: list[int] = []
    preempted: bool = False
    skip_pools: list[str] = []


class _PoolIn(_TraceModel):
    name: str
    free_slots: int | None = None
    free_gpus: float = 0.0
    free_cpus: int | None = None
    queued: int = Field(0, ge=0)
    reachable: bool = True
    reason: str = ""
    last_good: float | None = None
    free_nodes: int | None = None


class _TraceIn(_TraceModel):
    now: float | None = None
    queued: list[_QueuedIn]
    active: list[_ActiveIn] = []
    pools: list[_PoolIn] = []
    usage: dict[str, float] = {}


@dataclass(frozen=True)
class Trace:
    """What one cycle saw: the queue, the active tasks, the pools' reports, fair-share usage."""

    queued: list[QueuedTask]
    active: list[ActiveTask]
    pools: dict[str, PoolState]
    usage: dict[str, float]
    now: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "now": self.now,
            "queued": [
                {**asdict(t), "skip_pools": sorted(t.skip_pools)}
                for t in sorted(self.queued, key=lambda t: t.id)
            ],
            "active": [
                {
                    "id": t.id,
                    "owner": t.owner,
                    "team": t.team,
                    "resource": t.resource,
                    "pool": t.pool,
                    "running": t.running,
                    "since": t.since,
                    "borrowed": t.borrowed,
                    "gpus": list(t.gpus),
                    "preempted": t.preempted,
                    "skip_pools": sorted(t.skip_pools),
                }
                for t in sorted(self.active, key=lambda t: t.id)
            ],
            # What placement reads of each pool (not, say, a remote agent's words for `why`).
            "pools": [
                {k: v for k, v in asdict(s).items() if k in _PoolIn.model_fields}
                for _, s in sorted(self.pools.items())
            ],
            "usage": dict(self.usage),
        }


def parse_trace(text: str, source: str = "<trace>") -> Trace:
    """A trace from JSON: {"queued": [...], "active": [...], "pools": [...], "now": ...},
    or a bare list of queued tasks. Without "now", the latest time in the trace is used.

    Raises KliqueError naming the file, the entry and the fix.
    """
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise KliqueError(f"{source}: not valid JSON: {exc}; fix: give a JSON trace") from None
    if isinstance(data, list):
        data = {"queued": data}
    try:
        model = _TraceIn.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise KliqueError(
            f"{source}: not a trace: {problems}; fix: give a list of queued tasks "
            "{id, owner, team, resource, queued_at}, or an object with queued, active and pools"
        ) from None
    queued = [
        QueuedTask(q.id, q.owner, q.team, q.resource, q.queued_at, frozenset(q.skip_pools))
        for q in model.queued
    ]
    active = [
        ActiveTask(
            a.id,
            a.owner,
            a.team,
            a.resource,
            a.pool,
            a.running,
            a.since,
            borrowed=a.borrowed,
            gpus=tuple(a.gpus),
            preempted=a.preempted,
            skip_pools=frozenset(a.skip_pools),
        )
        for a in model.active
    ]
    pools = {p.name: PoolState(**p.model_dump()) for p in model.pools}
    times = [t.queued_at for t in queued] + [t.since for t in active]
    now = model.now if model.now is not None else max(times, default=0.0)
    return Trace(queued, active, pools, dict(model.usage), now)
