"""Reclaim: preempt borrowed runs so that a team below its reservation can start."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from broker.scheduler.capacity import HostModel, Need, PoolModel
from broker.scheduler.model import ActiveTask, QueuedTask, SchedulerSettings


@dataclass
class Reclaim:
    """The outcome: runs to preempt, and waiting tasks that reclaim will make room for."""

    preemptions: list[int] = field(default_factory=list)
    waiting: set[int] = field(default_factory=set)


@dataclass
class _Host:
    """A scratch copy of a host with the room of runs being stopped handed back."""

    room: HostModel
    borrowers: list[ActiveTask]


def reclaim(
    waiting: Sequence[tuple[QueuedTask, list[tuple[PoolModel, Need]]]],
    active: Sequence[ActiveTask],
    priority: Callable[[str | None], int],
    settings: SchedulerSettings,
    now: float,
) -> Reclaim:
    """Decide preemptions for `waiting` (task, its pools with its need there), oldest first.

    Victims are borrowed runs on the waiting task's host pools, lowest team priority first and
    newest first among equals. Nobody is preempted before `min_run_s`, a waiting task preempts
    only after `grace_s`, and at most `max_preemptions_per_cycle` runs stop per cycle. Room that
    runs already asked to stop will hand back is promised to waiting tasks before anyone else
    is preempted, so an unchanged situation preempts nobody twice.
    """
    out = Reclaim()
    if not waiting:
        return out
    on_pool: dict[str, list[ActiveTask]] = {}
    for run in active:
        on_pool.setdefault(run.pool, []).append(run)
    hosts: dict[str, _Host] = {}
    budget = settings.max_preemptions_per_cycle
    for task, targets in sorted(waiting, key=lambda w: (w[0].queued_at, w[0].id)):
        patient = now - task.queued_at >= settings.grace_s
        mine = [
            (hosts.get(m.pool.name) or _scratch(m, on_pool, priority, hosts), need)
            for m, need in targets
            if isinstance(m, HostModel)
        ]
        for host, need in mine:
            victims = _victims(host, need, settings, now, budget) if patient else None
            out.preemptions.extend(victims or ())
            budget -= len(victims or ())
            if _take(host, need):
                out.waiting.add(task.id)
                break
        else:
            if any(_would_fit(host, need) for host, need in mine):
                out.waiting.add(task.id)
    return out


def _scratch(
    model: HostModel,
    on_pool: dict[str, list[ActiveTask]],
    priority: Callable[[str | None], int],
    hosts: dict[str, _Host],
) -> _Host:
    room = model.scratch()
    mine = [a for a in on_pool.get(model.pool.name, []) if a.id in model.runs]
    for run in mine:
        if run.preempted:
            room.vacate(model.runs[run.id])
    borrowers = [a for a in mine if a.borrowed and not a.preempted]
    borrowers.sort(key=lambda a: (priority(a.team), -a.since, -a.id))
    hosts[model.pool.name] = _Host(room, borrowers)
    return hosts[model.pool.name]


def _victims(
    host: _Host, need: Need, settings: SchedulerSettings, now: float, budget: int
) -> list[int] | None:
    """The preferred borrowers to preempt so that `need` fits, their room freed in the scratch.

    None when the room of runs already stopping is enough, or no ripe set within the budget
    would make room (then nothing is freed).
    """
    room = host.room
    if room.find(need) is not None:
        return None
    ripe = [a for a in host.borrowers if now - a.since >= settings.min_run_s][:budget]
    chosen: list[ActiveTask] = []
    for run in ripe:
        room.vacate(room.runs[run.id])
        chosen.append(run)
        if room.find(need) is not None:
            break
    else:
        for run in chosen:
            room.occupy(room.runs[run.id])
        return None
    chosen = _keep_unneeded(room, need, chosen)
    for run in chosen:
        host.borrowers.remove(run)
    return [run.id for run in chosen]


def _keep_unneeded(room: HostModel, need: Need, chosen: list[ActiveTask]) -> list[ActiveTask]:
    """Spare the chosen runs whose room `need` turns out not to use (kept in preference order)."""
    needed = list(chosen)
    for run in reversed(chosen[:-1]):
        room.occupy(room.runs[run.id])
        if room.find(need) is None:
            room.vacate(room.runs[run.id])
        else:
            needed.remove(run)
    return needed


def _take(host: _Host, need: Need) -> bool:
    """Promise `need` room that runs being stopped hand back (or that the victims freed)."""
    alloc = host.room.find(need)
    if alloc is not None:
        host.room.occupy(alloc)
    return alloc is not None


def _would_fit(host: _Host, need: Need) -> bool:
    """Would `need` fit once every borrower here is gone (later, when reclaim may take them)?"""
    room = host.room
    for run in host.borrowers:
        room.vacate(room.runs[run.id])
    fits = room.find(need) is not None
    for run in host.borrowers:
        room.occupy(room.runs[run.id])
    return fits
