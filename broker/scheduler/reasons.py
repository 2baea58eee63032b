"""Why each task waits: one primary reason (PendingCode, by precedence) and a pool breakdown."""

from __future__ import annotations

from collections.abc import Sequence

from broker.domain import Estate
from broker.scheduler.capacity import PoolModel
from broker.scheduler.cycle import Cycle, Group
from broker.scheduler.model import ActiveTask, PendingCode, PendingReason, QueuedTask


def not_permitted(estate: Estate, task: QueuedTask) -> PendingReason:
    if task.resource not in estate.resources:
        detail = f"there is no compute resource named {task.resource!r}"
    elif task.team is None:
        detail = f"{task.owner} is in no team, and only teams with a policy may run"
    else:
        detail = f"team {task.team}'s policy does not list {task.resource}"
    return PendingReason(PendingCode.NOT_PERMITTED, detail)


def queued_reasons(cycle: Cycle, reclaiming: set[int]) -> dict[int, PendingReason]:
    """A reason for every queued task the cycle did not place.

    The texts depend on the situation (capacity, policies, pins), never on the clock, so an
    unchanged situation gives the same reasons every cycle. Tasks of one shape share one.
    """
    pending: dict[int, PendingReason] = {}
    headroom = _headroom(cycle)
    breakdowns: dict[tuple[str, tuple[str, ...]], dict[str, str]] = {}
    for group in sorted(cycle.groups, key=_first_pending):
        tasks = group.pending()
        if not tasks:
            continue
        over = _over_limit(cycle, group)
        if group.stop_code is PendingCode.NO_CAPACITY:
            room = len(tasks)
            if group.key in headroom:
                room = max(0, min(room, headroom[group.key]))
                headroom[group.key] -= room
            tasks, beyond = tasks[:room], tasks[room:]
            pending.update(dict.fromkeys((t.id for t in beyond), over))
            _capacity_reasons(cycle, group, tasks, reclaiming, breakdowns, pending)
        else:
            pending.update(dict.fromkeys((t.id for t in tasks), over))
    return pending


def _capacity_reasons(
    cycle: Cycle,
    group: Group,
    tasks: Sequence[QueuedTask],
    reclaiming: set[int],
    breakdowns: dict[tuple[str, tuple[str, ...]], dict[str, str]],
    pending: dict[int, PendingReason],
) -> None:
    key = (group.resource, group.order)
    if key not in breakdowns:
        breakdowns[key] = breakdown(cycle, group.resource, group.order)
    pools = breakdowns[key]
    # The sentence says it all; the per-pool breakdown says why each pool refused.
    full = PendingReason(PendingCode.NO_CAPACITY, "", pools)
    pending.update(dict.fromkeys((t.id for t in tasks), full))
    if reclaiming:
        back = _reclaim_reason(cycle, group, pools)
        pending.update({t.id: back for t in tasks if t.id in reclaiming})
    if group.pinned is not None:
        task_id, pool = group.pinned
        need = cycle.need(group.resource, pool)
        own = cycle.models[pool].refusal(need) if not isinstance(need, str) else need
        kept = {**pools, pool: f"{own}; kept free for this task until it fits"}
        detail = f"{pool} takes nothing else until it starts"
        pending[task_id] = PendingReason(PendingCode.NO_CAPACITY, detail, kept)


def _reclaim_reason(cycle: Cycle, group: Group, pools: dict[str, str]) -> PendingReason:
    amount = cycle.reservation(group.key)
    detail = (
        f"{amount} × {group.resource} are reserved for team {group.team}; "
        "borrowed runs in the way are preempted"
    )
    return PendingReason(PendingCode.RECLAIM, detail, pools)


def _over_limit(cycle: Cycle, group: Group) -> PendingReason:
    limit = cycle.limit(group.key)
    detail = (
        f"team {group.team}'s limit of {limit} × {group.resource} "
        "is taken by its active and earlier tasks"
    )
    return PendingReason(PendingCode.OVER_LIMIT, detail)


def _headroom(cycle: Cycle) -> dict[tuple[str | None, str], int]:
    """How many more tasks each (team, compute resource) with a limit may still start."""
    headroom = {}
    for group in cycle.groups:
        limit = cycle.limit(group.key)
        if limit is not None:
            headroom[group.key] = limit - cycle.count[group.key]
    return headroom


def _first_pending(group: Group) -> tuple[float, int]:
    tasks = group.pending()
    return (tasks[0].queued_at, tasks[0].id) if tasks else (0.0, 0)


def breakdown(cycle: Cycle, resource: str, order: tuple[str, ...]) -> dict[str, str]:
    """What each pool of the profile says to a task of `resource` that tries `order`."""
    pools: dict[str, str] = {}
    for name in cycle.estate.resources[resource].profile.pools:
        model = cycle.models.get(name)
        if name not in order:
            pools[name] = _withdrawn(cycle.estate, name)
        elif model is None:
            pools[name] = "not a pool of the estate"
        else:
            pools[name] = _refusal(cycle, model, resource)
    return pools


def _refusal(cycle: Cycle, model: PoolModel, resource: str) -> str:
    need = cycle.need(resource, model.pool.name)
    if isinstance(need, str):
        return need
    if model.reachable and model.pinned_for is not None:
        return f"kept free for task {model.pinned_for}, which has waited longest"
    return model.refusal(need)


def _withdrawn(estate: Estate, pool_name: str) -> str:
    pool = estate.pools.get(pool_name)
    wait = pool.max_wait_s if pool is not None else None
    return "withdrawn after max_wait" + (f" ({wait:g} s)" if wait is not None else "")


def pool_queue_reasons(
    estate: Estate, active: Sequence[ActiveTask], withdrawn: set[int]
) -> dict[int, PendingReason]:
    """A reason for every task that waits in a pool's own queue."""
    pending: dict[int, PendingReason] = {}
    for task in active:
        if task.running:
            continue
        pool = estate.pools.get(task.pool)
        wait = pool.max_wait_s if pool is not None else None
        if task.id in withdrawn:
            waited = f" ({wait:g} s)" if wait is not None else ""
            text = f"waited past max_wait{waited}; withdrawn to try the next pool"
        else:
            text = "waiting in its queue" + (
                f" ({task.native_reason})" if task.native_reason else ""
            )
            text += f"; moves on after max_wait ({wait:g} s)" if wait is not None else ""
        detail = f"in {task.pool}"
        pending[task.id] = PendingReason(PendingCode.POOL_QUEUE, detail, {task.pool: text})
    return pending
