"""Free capacity of each pool during one cycle: host pools GPU by GPU, queueing pools by count."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from broker.domain import Estate, Pool, Profile
from broker.execution import PoolState
from broker.scheduler.model import ActiveTask

EPS = 1e-9

# One task's hold on a host: (GPU index, share of that GPU) for each GPU it uses.
Alloc = tuple[tuple[int, float], ...]


@dataclass(frozen=True, slots=True)
class Need:
    """What one task of a compute resource takes in one pool, in that pool's units."""

    gpus: int = 0  # whole GPUs
    share: float = 0.0  # part of one GPU: a fraction, or GPU memory over the GPU's memory
    cpus: int = 1
    label: str = "no GPU"
    nodes: int = 1  # on a queueing pool: gpus and cpus above count every node's

    @property
    def total(self) -> float:
        return self.gpus + self.share


def need_of(profile: Profile, pool: Pool) -> Need | str:
    """The need in `pool`'s units, or why a task of this profile can never start there."""
    if profile.nodes > 1 and not pool.spans_nodes:
        wanted = profile.nodes
        return f"runs a task on one node, the task needs {wanted} (only batch pools span nodes)"
    if pool.queueing:
        return _queue_need(profile)
    return _host_need(profile, pool)


def _host_need(profile: Profile, pool: Pool) -> Need | str:
    if profile.gpu_memory_mb is not None:
        if pool.gpus <= 0:
            return "has no GPUs"
        if pool.gpu_memory_mb <= 0:
            return "declares no GPU memory (gpu_memory_mb)"
        if profile.gpu_memory_mb > pool.gpu_memory_mb:
            wanted, has = profile.gpu_memory_mb, pool.gpu_memory_mb
            return f"needs {wanted} MB of GPU memory, its GPUs have {has} MB"
        share = profile.gpu_memory_mb / pool.gpu_memory_mb
        return Need(
            share=share, cpus=profile.cpus, label=f"{profile.gpu_memory_mb} MB of GPU memory"
        )
    if profile.gpu_fraction is not None and profile.gpu_fraction < 1:
        if pool.gpus <= 0:
            return "has no GPUs"
        label = f"{profile.gpu_fraction:g} of a GPU"
        return Need(share=profile.gpu_fraction, cpus=profile.cpus, label=label)
    whole = profile.gpus or (1 if profile.gpu_fraction is not None else 0)
    if whole > pool.gpus:
        return f"needs {_gpus(whole)}, the pool has {pool.gpus}"
    return Need(gpus=whole, cpus=profile.cpus, label=_gpus(whole))


def _queue_need(profile: Profile) -> Need:
    # A batch scheduler allocates whole GPUs: counted as the script asks for them, per node.
    whole = profile.whole_gpus
    if profile.nodes > 1:
        label = f"{profile.nodes} nodes of {_gpus(whole)}" if whole else f"{profile.nodes} nodes"
        return Need(
            gpus=whole * profile.nodes,
            cpus=profile.cpus * profile.nodes,
            label=label,
            nodes=profile.nodes,
        )
    return Need(gpus=whole, cpus=profile.cpus, label=_gpus(whole))


def _gpus(n: float) -> str:
    return f"{n:g} GPU" if n == 1 else f"{n:g} GPUs"


@dataclass
class PoolModel:
    """A pool's capacity as this cycle sees it; subclasses count it in the pool's own units."""

    pool: Pool
    reachable: bool
    reason: str
    pinned_for: int | None = None  # a starving task this pool is kept for
    failed: set[Need] = field(default_factory=set)

    def take(self, need: Need) -> Alloc | None:
        """Take room for one task and return its GPUs, or None if it does not fit.

        Within a cycle room only shrinks, so a need that did not fit once is remembered and
        refused at once after: this keeps a cycle near-linear in the number of tasks.
        """
        if need in self.failed:
            return None
        alloc = self._take(need)
        if alloc is None:
            self.failed.add(need)
        return alloc

    def _take(self, need: Need) -> Alloc | None:
        raise NotImplementedError

    def refusal(self, need: Need) -> str:
        """Why `need` does not fit now, for the per-pool breakdown."""
        raise NotImplementedError


@dataclass
class QueueModel(PoolModel):
    """A Slurm/PBS/LSF pool: its reported free capacity, then room in its queue."""

    free_gpus: float = 0.0
    free_cpus: int | None = None
    free_slots: int | None = None
    queued: int = 0
    free_nodes: int | None = None  # idle nodes, where the pool counts them

    def _take(self, need: Need) -> Alloc | None:
        if self._starts_now(need):
            if self.free_nodes is not None and need.nodes > 1:
                self.free_nodes -= need.nodes
            self.free_gpus -= need.total
            if self.free_cpus is not None:
                self.free_cpus -= need.cpus
            if self.free_slots is not None:
                self.free_slots -= 1
            return ()
        if self.queued < self.pool.max_queued:
            self.queued += 1
            return ()
        return None

    def _starts_now(self, need: Need) -> bool:
        if self.free_slots is not None and self.free_slots < 1:
            return False
        if need.nodes > 1 and self.free_nodes is not None and self.free_nodes < need.nodes:
            return False
        if self.free_cpus is not None and self.free_cpus < need.cpus:
            return False
        if need.total > 0:
            return self.free_gpus >= need.total - EPS
        # A task without GPUs starts now only where the pool counts some room for it.
        return self.free_slots is not None or self.free_cpus is not None

    def refusal(self, need: Need) -> str:
        if not self.reachable:
            return f"unreachable: {self.reason}" if self.reason else "unreachable"
        if self._starts_now(need) or self.queued < self.pool.max_queued:
            return "no room left this cycle"
        return f"{self._short_of(need)}; at max_queued ({self.pool.max_queued})"

    def _short_of(self, need: Need) -> str:
        if self.free_slots is not None and self.free_slots < 1:
            return "no free slot"
        if need.nodes > 1 and self.free_nodes is not None and self.free_nodes < need.nodes:
            return f"needs {need.nodes} nodes, {self.free_nodes} idle"
        if self.free_cpus is not None and self.free_cpus < need.cpus:
            return f"needs {need.cpus} CPUs, {self.free_cpus} free"
        if need.total <= 0:
            return "reports no free room"
        return f"needs {need.label}, {self.free_gpus:g} free"


@dataclass
class Hold:
    """Room kept on a host for a reservation its team is not using yet."""

    team: str
    resource: str
    alloc: Alloc


@dataclass
class HostModel(PoolModel):
    """A bare-metal host pool: slots, and each GPU's free share (memory counted as a share)."""

    slots: int = 0
    free: dict[int, float] = field(default_factory=dict)  # by the host's GPU id
    runs: dict[int, Alloc] = field(default_factory=dict)  # active tasks' GPUs, for reclaim
    borrowed_gpus: float = 0.0  # held by borrowed runs, for the breakdown
    holds: list[Hold] = field(default_factory=list)
    failed_borrowing: set[Need] = field(default_factory=set)

    @classmethod
    def of(cls, pool: Pool, reachable: bool, reason: str) -> HostModel:
        return cls(pool, reachable, reason, slots=pool.slots, free=dict.fromkeys(pool.devices, 1.0))

    def scratch(self) -> HostModel:
        """A copy of the room on this host, to try out a reclaim without changing the cycle."""
        return HostModel(
            self.pool,
            self.reachable,
            self.reason,
            slots=self.slots,
            free=dict(self.free),
            runs=self.runs,
        )

    def _take(self, need: Need) -> Alloc | None:
        alloc = self.find(need)
        if alloc is not None:
            self.occupy(alloc)
        return alloc

    def find(self, need: Need) -> Alloc | None:
        """The GPUs `need` would get: whole GPUs lowest first, a share on the fullest that fits."""
        if self.slots < 1:
            return None
        if need.gpus:
            whole = [i for i, f in self.free.items() if f >= 1.0 - EPS][: need.gpus]
            return tuple((i, 1.0) for i in whole) if len(whole) == need.gpus else None
        if need.share:
            # Best fit keeps whole GPUs free for whole-GPU tasks.
            fits = [(f, i) for i, f in self.free.items() if f >= need.share - EPS]
            return ((min(fits)[1], need.share),) if fits else None
        return ()

    def occupy(self, alloc: Alloc) -> None:
        self.slots -= 1
        for i, share in alloc:
            self.free[i] -= share

    def vacate(self, alloc: Alloc) -> None:
        self.slots += 1
        for i, share in alloc:
            self.free[i] += share

    def hold(self, team: str, resource: str, need: Need) -> bool:
        alloc = self.find(need)
        if alloc is None:
            return False
        self.occupy(alloc)
        self.holds.append(Hold(team, resource, alloc))
        return True

    def borrow(self, need: Need) -> Alloc | None:
        """Fit `need` by lending held room, newest hold first; keep every hold that still fits.

        Returns None if it would not fit even with every hold lent (remembered).
        """
        if not self.holds or need in self.failed_borrowing:
            return None
        lent: list[Hold] = []
        alloc = self.find(need)
        while alloc is None and self.holds:
            lent.append(self.holds.pop())
            self.vacate(lent[-1].alloc)
            alloc = self.find(need)
        if alloc is None:
            self.failed_borrowing.add(need)
        else:
            self.occupy(alloc)
            self.borrowed_gpus += sum(share for _, share in alloc)
            # Lending may leave more unheld room than before: earlier verdicts no longer hold.
            self.failed.clear()
        for hold in reversed(lent):
            again = self.find_like(hold.alloc)
            if again is not None:
                self.occupy(again)
                self.holds.append(Hold(hold.team, hold.resource, again))
        return alloc

    def find_like(self, alloc: Alloc) -> Alloc | None:
        whole = sum(1 for _, share in alloc if share >= 1.0 - EPS)
        share = sum(share for _, share in alloc if share < 1.0 - EPS)
        return self.find(Need(gpus=whole, share=share))

    def refusal(self, need: Need) -> str:
        if not self.reachable:
            return f"unreachable: {self.reason}" if self.reason else "unreachable"
        if self.slots < 1:
            return f"all {self.pool.slots} slots in use"
        if need.gpus:
            free = sum(1 for f in self.free.values() if f >= 1.0 - EPS)
            head = f"needs {need.label}, {free} free"
        elif need.share:
            head = f"needs {need.label}, no GPU has that much left"
        else:
            return "no room left this cycle"
        return head + self._held_by()

    def _held_by(self) -> str:
        parts = ""
        if self.borrowed_gpus > EPS:
            parts += f", {self.borrowed_gpus:g} held by borrowers"
        held = sum(share for hold in self.holds for _, share in hold.alloc)
        if held > EPS:
            parts += f", {held:g} held for reservations"
        return parts


def build_models(
    estate: Estate, states: Mapping[str, PoolState], active: Sequence[ActiveTask]
) -> dict[str, PoolModel]:
    """Every pool of the estate as this cycle finds it, with the active tasks' room taken."""
    on_pool: dict[str, list[ActiveTask]] = {}
    for task in active:
        on_pool.setdefault(task.pool, []).append(task)
    models: dict[str, PoolModel] = {}
    for name, pool in estate.pools.items():
        state = states.get(name)
        reachable = state is not None and state.reachable
        reason = "no report from the pool this cycle" if state is None else state.reason
        tasks = on_pool.get(name, [])
        if pool.queueing:
            models[name] = _queue_model(pool, state, reachable, reason, tasks)
        else:
            models[name] = _host_model(estate, pool, reachable, reason, tasks)
    return models


def _queue_model(
    pool: Pool, state: PoolState | None, reachable: bool, reason: str, tasks: list[ActiveTask]
) -> QueueModel:
    state = state or PoolState(pool.name)
    # The pool's report may lag Klique's own submissions; trust whichever counts more.
    waiting = sum(1 for task in tasks if not task.running)
    return QueueModel(
        pool,
        reachable,
        reason,
        free_gpus=state.free_gpus,
        free_cpus=state.free_cpus,
        free_slots=state.free_slots,
        queued=max(state.queued, waiting),
        free_nodes=state.free_nodes,
    )


def _host_model(
    estate: Estate, pool: Pool, reachable: bool, reason: str, tasks: list[ActiveTask]
) -> HostModel:
    model = HostModel.of(pool, reachable, reason)
    # Tasks that say which GPUs they hold go first, so the others are fitted around them.
    for task in sorted(tasks, key=lambda t: (not t.gpus, t.id)):
        resource = estate.resources.get(task.resource)
        need = need_of(resource.profile, pool) if resource else Need()
        alloc = _alloc_of(model, task.gpus, need if isinstance(need, Need) else Need())
        model.occupy(alloc)
        model.runs[task.id] = alloc
        if task.borrowed:
            model.borrowed_gpus += need.total if isinstance(need, Need) else 0.0
    return model


def _alloc_of(model: HostModel, gpus: tuple[int, ...], need: Need) -> Alloc:
    """The GPUs an active task holds: as reported, else where it would be put now."""
    share = need.share if need.share else 1.0
    if gpus and all(i in model.free for i in gpus):
        return tuple((i, share) for i in gpus)
    found = model.find(need)
    if found is not None:
        return found
    # More runs than the host has room for (the estate shrank): count them where most is free.
    fullest_last = sorted(model.free, key=lambda i: (-model.free[i], i))
    count = need.gpus if need.gpus else (1 if need.share else 0)
    return tuple((i, share) for i in fullest_last[:count])
