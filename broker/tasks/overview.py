"""The estate as a caller sees it beside their tasks: compute resources, pools, usage from
the ledger, and a placement cycle under a changed estate (which changes nothing)."""

from __future__ import annotations

import time

from broker import authz
from broker.domain import Estate, TaskState
from broker.estate import parse_estate
from broker.execution import HOLDING, PoolState
from broker.identity.resolve import Caller
from broker.scheduler.fairshare import UsageRow, decayed_usage
from broker.scheduler.model import active_of
from broker.scheduler.simulate import Trace, queued_of, simulate
from broker.store.repository import Store
from broker.tasks.schemas import (
    ResourceOut,
    SimulateRequest,
    SimulationOut,
    UsageLineOut,
    UsageOut,
)
from broker.usage import Run, UsageKey, summarise


def resources_out(estate: Estate, who: Caller) -> list[ResourceOut]:
    """Every compute resource, and whether the caller's team may use it."""
    return [
        ResourceOut.of(r, permitted=estate.permitted(who.team, r.name))
        for r in estate.resources.values()
    ]


def usage_out(store: Store, who: Caller, by: UsageKey, since: float | None) -> UsageOut:
    """GPU-seconds and wall seconds from the ledger; admins see everyone, users themselves."""
    until = time.time()
    runs = [
        Run(r.owner, r.team, r.project, r.resource, r.pool, r.gpus, r.start, r.end)
        for r in store.ledger(since=since)
        if authz.sees_owner(who, r.owner)
    ]
    return UsageOut(
        by=by,
        since=since,
        until=until,
        everyone=who.admin,
        rows=[
            UsageLineOut(
                key=line.key,
                runs=line.runs,
                gpu_seconds=line.gpu_seconds,
                gpu_hours=line.gpu_hours,
                wall_seconds=line.wall_seconds,
                ongoing=line.ongoing,
            )
            for line in summarise(runs, by, until, since)
        ],
    )


def simulation_out(
    store: Store, states: dict[str, PoolState], body: SimulateRequest, who: Caller
) -> SimulationOut:
    """One placement cycle of the current queue under a changed estate; changes nothing.
    `states` are the pools' latest published states."""
    authz.check_admin(who, "simulate a changed estate")
    estate = parse_estate(body.estate, body.source)
    now = time.time()
    queued = [queued_of(t) for t in store.tasks(states=[TaskState.QUEUED])]
    active = [active_of(t, now) for t in store.tasks(states=HOLDING)]
    half_life = estate.fair_share_half_life_s
    ledger = store.ledger(since=now - 10 * half_life)
    shares = decayed_usage(
        [UsageRow(r.team or "", r.start, r.end, r.gpus) for r in ledger], now, half_life
    )
    result = simulate(estate, queued, active, states, shares, now)
    out = SimulationOut.model_validate(result.to_dict())
    if body.include_trace:
        out.trace = Trace(queued, active, states, shares, now).to_dict()
    return out
