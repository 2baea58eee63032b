"""Placement as a pure function: (queued tasks, pools and their free capacity, policies,
usage) -> (placements, withdrawals, preemptions, pending reasons). No I/O here.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.domain import Estate
from broker.scheduler.cycle import Cycle, Group
from broker.scheduler.fairshare import UsageRow, decayed_usage
from broker.scheduler.model import (
    ActiveTask,
    PendingCode,
    PendingReason,
    PlacementDecision,
    QueuedTask,
    SchedulerInput,
    SchedulerOutput,
    SchedulerSettings,
)
from broker.scheduler.reasons import not_permitted, pool_queue_reasons, queued_reasons
from broker.scheduler.reclaim import reclaim

__all__ = [
    "ActiveTask",
    "PendingCode",
    "PendingReason",
    "PlacementDecision",
    "QueuedTask",
    "SchedulerInput",
    "SchedulerOutput",
    "SchedulerSettings",
    "UsageRow",
    "decayed_usage",
    "place",
]


def place(inputs: SchedulerInput) -> SchedulerOutput:
    """Place every queued task it can; say why each of the others waits.

    - A task walks its profile's pools in order and goes to the first that can start it now.
      Host pools count slots and each GPU's free share: a fraction packs onto the fullest GPU
      that still fits, and GPU memory counts as a share of one GPU. Queueing pools (Slurm,
      PBS, LSF) count their reported free capacity, then room in their queue up to
      `max_queued`. Unreachable pools refuse with their reason (`capacity`).
    - Reservations are guaranteed on the capacity Klique controls, the host pools: a team's
      tasks up to its reservation go first, and room kept for a reservation nobody is using is
      lent only as a last resort, marked `borrowed` (`cycle`), and reclaimed by preempting
      when its team comes back (`reclaim`). A limit caps a team's active tasks of a compute
      resource across all pools. Surplus goes by priority, then fair share (decayed usage,
      `fairshare`), then age.
    - No head-of-line blocking: a task that does not fit stops only the tasks of its own
      shape (team, compute resource, pools to try); everyone else carries on.
    - No starvation, by a pinned reservation: a task waiting longer than
      `SchedulerSettings.starvation_s` is placed before the surplus and, if it still does not
      fit, keeps the first host pool that could hold it free of new work until it starts
      (reservations still go first there). Queueing pools need no pin: their own schedulers
      reserve for large jobs, and room in their queue goes to starving tasks first.
    - Spill-over: a task waiting in a pool's own queue past that pool's `max_wait_s` is
      withdrawn when another pool of its profile is reachable; the loop requeues it with that
      pool skipped. A task withdrawn from every pool of its profile starts over from the first.
    - Every task left waiting gets a reason, in `pending` (`reasons`).
    """
    groups, refused = _group(inputs.estate, inputs.queued)
    cycle = Cycle(inputs, groups)
    cycle.run()
    waiting = [
        (task, group.targets)
        for group in groups
        for task in group.pending()[: group.reserved_pending]
    ]
    outcome = reclaim(waiting, inputs.active, cycle.priority, inputs.settings, inputs.now)
    withdrawals = _withdrawals(cycle)
    pending = queued_reasons(cycle, outcome.waiting)
    pending.update(refused)
    pending.update(pool_queue_reasons(inputs.estate, inputs.active, set(withdrawals)))
    return SchedulerOutput(cycle.placements, pending, withdrawals, outcome.preemptions)


def _group(
    estate: Estate, queued: Sequence[QueuedTask]
) -> tuple[list[Group], dict[int, PendingReason]]:
    """Sort the permitted tasks into groups of one shape; refuse the others."""
    by_shape: dict[tuple[str | None, str, frozenset[str]], Group] = {}
    refused: dict[int, PendingReason] = {}
    allowed: dict[tuple[str | None, str], bool] = {}
    for task in queued:
        key = (task.team, task.resource)
        if key not in allowed:
            allowed[key] = task.resource in estate.resources and estate.permitted(*key)
        if not allowed[key]:
            refused[task.id] = not_permitted(estate, task)
            continue
        group = by_shape.get((task.team, task.resource, task.skip_pools))
        if group is None:
            group = _new_group(estate, task, len(by_shape))
            by_shape[(task.team, task.resource, task.skip_pools)] = group
        group.tasks.append(task)
    groups = list(by_shape.values())
    for group in groups:
        group.tasks.sort(key=lambda t: (t.queued_at, t.id))
    return groups, refused


def _new_group(estate: Estate, task: QueuedTask, seq: int) -> Group:
    pools = estate.resources[task.resource].profile.pools
    order = tuple(p for p in pools if p not in task.skip_pools) or pools
    return Group(seq, task.team, task.resource, order)


def _withdrawals(cycle: Cycle) -> list[int]:
    """Tasks waiting in a pool's own queue past its max_wait_s, when another pool may take them."""
    out = []
    now = cycle.inputs.now
    for task in cycle.inputs.active:
        pool = cycle.estate.pools.get(task.pool)
        if task.running or task.preempted or pool is None or pool.max_wait_s is None:
            continue
        if now - task.since >= pool.max_wait_s and _elsewhere(cycle, task):
            out.append(task.id)
    return out


def _elsewhere(cycle: Cycle, task: ActiveTask) -> bool:
    resource = cycle.estate.resources.get(task.resource)
    if resource is None:
        return False
    others = [p for p in resource.profile.pools if p not in task.skip_pools | {task.pool}]
    return bool(cycle.targets(task.resource, tuple(others)))
