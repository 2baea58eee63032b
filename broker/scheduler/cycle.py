"""One placement cycle: queued tasks grouped by shape, then placed in three tiers."""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from broker.scheduler.capacity import HostModel, Need, PoolModel, build_models, need_of
from broker.scheduler.model import PendingCode, PlacementDecision, QueuedTask, SchedulerInput

TeamResource = tuple[str | None, str]
Target = tuple[PoolModel, Need]
HeapKey = tuple[float, ...]  # ends with the group's index


@dataclass
class Group:
    """Queued tasks of one shape (team, compute resource, pools to try), oldest first."""

    seq: int
    team: str | None
    resource: str
    order: tuple[str, ...]  # pools to try, in profile order, less the withdrawn ones
    tasks: list[QueuedTask] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)  # reachable pools of `order`
    next: int = 0
    stop: int | None = None  # tasks from here on pend
    stop_code: PendingCode = PendingCode.NO_CAPACITY
    reserved_pending: int = 0  # pending tasks from `stop` that are within the reservation
    pinned: tuple[int, str] | None = None  # (task id, pool) of its task that pinned a pool

    @property
    def key(self) -> TeamResource:
        return (self.team, self.resource)

    @property
    def head(self) -> QueuedTask:
        return self.tasks[self.next]

    @property
    def live(self) -> bool:
        return self.stop is None and self.next < len(self.tasks)

    def halt(self, code: PendingCode) -> None:
        self.stop, self.stop_code = self.next, code

    def pending(self) -> list[QueuedTask]:
        return [] if self.stop is None else self.tasks[self.stop :]


class Cycle:
    """The mutable state of one call to `place`: pool capacity, counts, groups, decisions."""

    def __init__(self, inputs: SchedulerInput, groups: list[Group]) -> None:
        self.inputs = inputs
        self.estate = inputs.estate
        self.models = build_models(inputs.estate, inputs.pools, inputs.active)
        self.count: Counter[TeamResource] = Counter((a.team, a.resource) for a in inputs.active)
        self.reserve_left = self._reserve_left()
        self.groups = groups
        self.placements: list[PlacementDecision] = []
        self._needs: dict[tuple[str, str], Need | str] = {}
        for group in groups:
            group.targets = self.targets(group.resource, group.order)

    def run(self) -> None:
        """Place in three tiers, each in its own order.

        1. Reservations: each team's tasks up to its reservation, oldest first, on any room.
        2. Starving: tasks older than `starvation_s`, oldest first; one that still does not
           fit pins the first host pool that could ever hold it, which then takes nothing else.
        3. Surplus: the rest by team priority, then decayed usage (fair share), then age. Room
           held for other teams' unused reservations is lent only when nothing else fits.
        """
        self.reserved_tier()
        self.hold_idle_reservations()
        self.starving_tier()
        self.surplus_tier()

    def limit(self, key: TeamResource) -> int | None:
        policy = self.estate.policies.get(key[0] or "")
        return None if policy is None else policy.limit.get(key[1])

    def reservation(self, key: TeamResource) -> int:
        policy = self.estate.policies.get(key[0] or "")
        return 0 if policy is None else policy.reservation.get(key[1], 0)

    def priority(self, team: str | None) -> int:
        policy = self.estate.policies.get(team or "")
        return 0 if policy is None else policy.priority

    # -- tiers --------------------------------------------------------------------------------

    def reserved_tier(self) -> None:
        heap = [_by_age(g) for g in self.groups if g.live and self.reserve_left.get(g.key, 0) > 0]
        heapq.heapify(heap)
        for group in _drain(heap, self.groups):
            if self.reserve_left.get(group.key, 0) <= 0 or not self._within_limit(group):
                continue
            if self._place_head(group, borrow=False, honour_pins=False):
                self.reserve_left[group.key] -= 1
                if group.live and self.reserve_left[group.key] > 0:
                    heapq.heappush(heap, _by_age(group))
            else:
                group.halt(PendingCode.NO_CAPACITY)
                reserved = min(self.reserve_left[group.key], len(group.pending()))
                group.reserved_pending = reserved
                self.reserve_left[group.key] -= reserved

    def hold_idle_reservations(self) -> None:
        """Keep room on hosts for reservations whose teams have nothing queued for them."""
        for (team, resource), idle in self.reserve_left.items():
            order = self.estate.resources[resource].profile.pools
            for model, need in self.targets(resource, order):
                if isinstance(model, HostModel):
                    while idle > 0 and model.hold(team or "", resource, need):
                        idle -= 1

    def starving_tier(self) -> None:
        cutoff = self.inputs.now - self.inputs.settings.starvation_s
        heap = [_by_age(g) for g in self.groups if g.live and g.head.queued_at <= cutoff]
        heapq.heapify(heap)
        for group in _drain(heap, self.groups):
            if not self._within_limit(group):
                continue
            if self._place_head(group, borrow=True, honour_pins=True):
                if group.live and group.head.queued_at <= cutoff:
                    heapq.heappush(heap, _by_age(group))
            else:
                self._pin(group)
                group.halt(PendingCode.NO_CAPACITY)

    def surplus_tier(self) -> None:
        heap = [self._by_share(g) for g in self.groups if g.live]
        heapq.heapify(heap)
        for group in _drain(heap, self.groups):
            if not self._within_limit(group):
                continue
            if self._place_head(group, borrow=True, honour_pins=True):
                if group.live:
                    heapq.heappush(heap, self._by_share(group))
            else:
                group.halt(PendingCode.NO_CAPACITY)

    # -- one task -----------------------------------------------------------------------------

    def _within_limit(self, group: Group) -> bool:
        limit = self.limit(group.key)
        if limit is not None and self.count[group.key] >= limit:
            group.halt(PendingCode.OVER_LIMIT)
            return False
        return True

    def _place_head(self, group: Group, borrow: bool, honour_pins: bool) -> bool:
        task = group.head
        decision = self._try(group.targets, task.id, honour_pins)
        if decision is None and borrow:
            decision = self._try_borrowing(group.targets, task.id, honour_pins)
        if decision is None:
            return False
        self.placements.append(decision)
        self.count[group.key] += 1
        group.next += 1
        return True

    def _try(
        self, targets: list[Target], task_id: int, honour_pins: bool
    ) -> PlacementDecision | None:
        for model, need in targets:
            if honour_pins and model.pinned_for not in (None, task_id):
                continue
            alloc = model.take(need)
            if alloc is not None:
                return PlacementDecision(task_id, model.pool.name, gpus=tuple(i for i, _ in alloc))
        return None

    def _try_borrowing(
        self, targets: list[Target], task_id: int, honour_pins: bool
    ) -> PlacementDecision | None:
        for model, need in targets:
            if not isinstance(model, HostModel):
                continue
            if honour_pins and model.pinned_for not in (None, task_id):
                continue
            alloc = model.borrow(need)
            if alloc is not None:
                gpus = tuple(i for i, _ in alloc)
                return PlacementDecision(task_id, model.pool.name, borrowed=True, gpus=gpus)
        return None

    def _pin(self, group: Group) -> None:
        """Keep the first host pool that could ever hold the head task for it alone."""
        for model, _need in group.targets:
            if isinstance(model, HostModel) and model.pinned_for is None and model.pool.slots > 0:
                model.pinned_for = group.head.id
                group.pinned = (group.head.id, model.pool.name)
                return

    # -- set-up -------------------------------------------------------------------------------

    def _reserve_left(self) -> dict[TeamResource, int]:
        left: dict[TeamResource, int] = {}
        for team, policy in self.estate.policies.items():
            for resource, amount in policy.reservation.items():
                if resource in self.estate.resources:
                    left[(team, resource)] = max(0, amount - self.count[(team, resource)])
        return left

    def targets(self, resource: str, order: tuple[str, ...]) -> list[Target]:
        """The reachable pools of `order` that could ever start `resource`, with its need there."""
        targets: list[Target] = []
        for name in order:
            model = self.models.get(name)
            if model is None or not model.reachable:
                continue
            need = self.need(resource, name)
            if not isinstance(need, str):
                targets.append((model, need))
        return targets

    def need(self, resource: str, pool_name: str) -> Need | str:
        key = (resource, pool_name)
        if key not in self._needs:
            profile = self.estate.resources[resource].profile
            self._needs[key] = need_of(profile, self.estate.pools[pool_name])
        return self._needs[key]

    def _by_share(self, group: Group) -> HeapKey:
        usage = self.inputs.usage.get(group.team or "", 0.0)
        head = group.head
        return (-self.priority(group.team), usage, head.queued_at, head.id, group.seq)


def _by_age(group: Group) -> HeapKey:
    return (group.head.queued_at, group.head.id, group.seq)


def _drain(heap: list[HeapKey], groups: list[Group]) -> Iterator[Group]:
    """Pop groups in heap order; the last element of every key is the group's index."""
    while heap:
        group = groups[int(heapq.heappop(heap)[-1])]
        if group.live:
            yield group
