"""Estate rules about policies: reservations that fit their pools and stay under their limits."""

from __future__ import annotations

from collections import Counter

from broker.domain import Estate, Policy
from broker.scheduler.capacity import HostModel, Need, need_of

Problem = tuple[str, str]  # (dotted path in the estate file, message with the fix)


def policy_problems(estate: Estate) -> list[Problem]:
    """Every policy problem in `estate`: amounts first, in declaration order, then overfills.

    Reservations are checked against the capacity Klique controls, the host pools: every
    reserved unit is packed onto empty hosts along its compute resource's pool order, the most
    constrained and largest first. A unit that fits no host is a problem unless its profile
    also lists a queueing pool, whose size Klique cannot know.
    """
    problems: list[Problem] = []
    for key, policy in estate.policies.items():
        problems += _amount_problems(estate, key, policy)
    return problems + _oversubscribed(estate)


def _amount_problems(estate: Estate, key: str, policy: Policy) -> list[Problem]:
    problems: list[Problem] = []
    for part, amounts in (("reservation", policy.reservation), ("limit", policy.limit)):
        for resource, amount in amounts.items():
            path = f"policies.{key}.{part}.{resource}"
            problem = _amount_problem(estate, policy, part, resource, amount)
            if problem:
                problems.append((path, problem))
    return problems


def _amount_problem(estate: Estate, policy: Policy, part: str, resource: str, amount: int) -> str:
    if resource not in estate.resources:
        known = ", ".join(sorted(estate.resources)) or "none"
        return f"no compute resource named {resource!r}; fix: use one of {known}"
    if resource not in policy.resources:
        return f"{resource} is not in the team's resources; fix: add it there or drop this {part}"
    if amount < 0:
        return f"a {part} cannot be negative ({amount}); fix: use 0 or more"
    limit = policy.limit.get(resource)
    if part == "reservation" and limit is not None and amount > limit:
        return (
            f"reserves {amount} × {resource} but the limit is {limit}; "
            "fix: lower the reservation or raise the limit"
        )
    return ""


def _oversubscribed(estate: Estate) -> list[Problem]:
    hosts = {
        name: HostModel.of(pool, True, "")
        for name, pool in estate.pools.items()
        if not pool.queueing
    }
    left_out: Counter[tuple[str, str]] = Counter()
    for key, resource, need_by_pool in _reserved_units(estate, hosts):
        if not any(hosts[name].take(need) is not None for name, need in need_by_pool):
            left_out[(key, resource)] += 1
    return [_oversubscribed_problem(estate, key, res, n) for (key, res), n in left_out.items()]


def _reserved_units(
    estate: Estate, hosts: dict[str, HostModel]
) -> list[tuple[str, str, list[tuple[str, Need]]]]:
    """One entry per reserved unit that only host pools can serve: the fewest pools first, then
    the largest, which packs the way a person would check it."""
    units = []
    for key, policy in estate.policies.items():
        for resource, amount in policy.reservation.items():
            compute = estate.resources.get(resource)
            if compute is None or amount <= 0:
                continue
            pools = [estate.pools[p] for p in compute.profile.pools if p in estate.pools]
            if any(pool.queueing for pool in pools):
                continue
            needs = [(p.name, need_of(compute.profile, p)) for p in pools if p.name in hosts]
            fits = [(name, need) for name, need in needs if isinstance(need, Need)]
            size = max((need.total for _, need in fits), default=0.0)
            units += [(size, key, resource, fits)] * amount
    units.sort(key=lambda unit: (len(unit[3]), -unit[0]))
    return [(key, resource, fits) for _, key, resource, fits in units]


def _oversubscribed_problem(estate: Estate, key: str, resource: str, left_out: int) -> Problem:
    pools = ", ".join(estate.resources[resource].profile.pools) or "none"
    others = sorted(
        k
        for k, policy in estate.policies.items()
        if k != key and _shares_pools(estate, resource, policy)
    )
    beside = f" beside the reservations of {', '.join(others)}" if others else ""
    amount = estate.policies[key].reservation[resource]
    message = (
        f"{left_out} of the {amount} × {resource} reserved here do not fit on its pools "
        f"({pools}){beside}; fix: lower a reservation or add capacity to these pools"
    )
    return (f"policies.{key}.reservation.{resource}", message)


def _shares_pools(estate: Estate, resource: str, policy: Policy) -> bool:
    mine = set(estate.resources[resource].profile.pools)
    for other, amount in policy.reservation.items():
        compute = estate.resources.get(other)
        if amount > 0 and compute is not None and mine & set(compute.profile.pools):
            return True
    return False
