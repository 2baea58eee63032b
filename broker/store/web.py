"""The web UI's part of the store: the task list's pages, filters, search and changes. The
only SQL the UI needs; it goes through the Store's own transactions (browser sessions are
broker/store/identity.py's)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, func, select

from broker.domain import Task, TaskState
from broker.store.repository import Store
from broker.store.rows import tag_like, task_of
from broker.store.tables import ScalarRow, TaskRow

# A search looks through at most this many of the newest tasks (under the other filters) per
# page, so that a rare word costs the same as a common one; the page says where it stopped.
SEARCH_WINDOW = 20_000


@dataclass(frozen=True)
class TaskFilter:
    """What the task list shows: whose, which states, which project, and a search word."""

    owner: str | None = None  # None: everyone's (admins only)
    states: tuple[TaskState, ...] = ()
    project: str | None = None
    search: str = ""
    tag: str | None = None
    team: str | None = None  # a team's tasks (the caller's), whoever owns them
    archived: bool = False  # the archived tasks instead of the rest

    def matches(self, task: Task) -> bool:
        """The same test in Python, for tasks that arrive while a page is open."""
        if self.owner is not None and task.owner != self.owner:
            return False
        if self.team is not None and task.team != self.team:
            return False
        if self.tag is not None and self.tag not in task.tags:
            return False
        if (task.archived_at is not None) != self.archived:
            return False
        if self.states and task.state not in self.states:
            return False
        if self.project is not None and task.spec.project != self.project:
            return False
        word = self.search.casefold()
        return not word or word in task.spec.name.casefold() or word in task.spec.project.casefold()


@dataclass(frozen=True)
class TaskPage:
    tasks: list[Task]
    next_before: int | None  # pass as `before` for the next page; None: this was the last
    searched_to: int | None  # a search stopped at this id (its window ended there)


def _filtered(query: Select[Any], where: TaskFilter, before: int | None) -> Select[Any]:
    query = query.where(TaskRow.deleted_at.is_(None))
    if before is not None:
        query = query.where(TaskRow.id < before)
    if where.owner is not None:
        query = query.where(TaskRow.owner == where.owner)
    if where.states:
        query = query.where(TaskRow.state.in_([s.value for s in where.states]))
    if where.project is not None:
        query = query.where(TaskRow.project == where.project)
    if where.team is not None:
        query = query.where(TaskRow.team == where.team)
    if where.tag is not None:
        query = query.where(TaskRow.tags.like(tag_like(where.tag), escape="\\"))
    if where.archived:
        return query.where(TaskRow.archived_at.is_not(None))
    return query.where(TaskRow.archived_at.is_(None))


def _like(word: str) -> str:
    escaped = word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def task_page(store: Store, where: TaskFilter, before: int | None, limit: int) -> TaskPage:
    """One page of tasks, newest first, keyset-paged on id: never more than `limit` rows read
    (a search reads at most SEARCH_WINDOW ids)."""
    query = _filtered(select(TaskRow), where, before).order_by(TaskRow.id.desc())
    searched_to = None
    with store.read() as session:
        if where.search:
            window = (
                _filtered(select(TaskRow.id), where, before)
                .order_by(TaskRow.id.desc())
                .limit(SEARCH_WINDOW)
                .subquery()
            )
            pattern = _like(where.search)
            query = query.where(
                TaskRow.id.in_(select(window.c.id)),
                TaskRow.name.ilike(pattern, escape="\\")
                | TaskRow.project.ilike(pattern, escape="\\"),
            )
            count, lowest = session.execute(select(func.count(), func.min(window.c.id))).one()
            searched_to = lowest if count == SEARCH_WINDOW else None
        rows = list(session.scalars(query.limit(limit + 1)))
    tasks = [task_of(row, with_diff=False) for row in rows[:limit]]
    if len(rows) > limit:
        return TaskPage(tasks, tasks[-1].id, None)
    return TaskPage(tasks, searched_to, searched_to)


def changed_since(
    store: Store, since: float, owner: str | None, limit: int = 500
) -> list[tuple[Task, float]]:
    """Tasks written after `since`, with when (oldest change first): what a live page redraws."""
    query = select(TaskRow).where(TaskRow.updated_at > since, TaskRow.deleted_at.is_(None))
    if owner is not None:
        query = query.where(TaskRow.owner == owner)
    query = query.order_by(TaskRow.updated_at).limit(limit)
    with store.read() as session:
        return [(task_of(row, with_diff=False), row.updated_at) for row in session.scalars(query)]


def tasks_by_id(store: Store, ids: Iterable[int], owner: str | None) -> list[Task]:
    """These tasks (of `owner` only, unless None), without their diffs."""
    query = select(TaskRow).where(TaskRow.id.in_(list(ids)), TaskRow.deleted_at.is_(None))
    if owner is not None:
        query = query.where(TaskRow.owner == owner)
    with store.read() as session:
        return [task_of(row, with_diff=False) for row in session.scalars(query)]


def updated_at(store: Store, task_id: int) -> float | None:
    with store.read() as session:
        return session.scalar(select(TaskRow.updated_at).where(TaskRow.id == task_id))


def projects(store: Store, owner: str | None, limit: int = 500) -> list[str]:
    """The projects for the filter's choices (read from the project index)."""
    query = select(TaskRow.project).distinct()
    if owner is not None:
        query = query.where(TaskRow.owner == owner)
    with store.read() as session:
        return sorted(session.scalars(query.order_by(TaskRow.project).limit(limit)))


def owners(store: Store, limit: int = 500) -> list[str]:
    query = select(TaskRow.owner).distinct().order_by(TaskRow.owner).limit(limit)
    with store.read() as session:
        return list(session.scalars(query))


def scalars_after(store: Store, task_ids: Iterable[int], after: int = 0) -> list[dict[str, Any]]:
    """Scalars of these tasks recorded after the scalar id `after`, with their ids."""
    query = (
        select(ScalarRow)
        .where(ScalarRow.task_id.in_(list(task_ids)), ScalarRow.id > after)
        .order_by(ScalarRow.id)
    )
    with store.read() as session:
        return [
            {
                "id": s.id,
                "task": s.task_id,
                "name": s.name,
                "series": s.series,
                "step": s.step,
                "value": s.value,
            }
            for s in session.scalars(query)
        ]


def tally(
    store: Store, states: Iterable[TaskState], *keys: str
) -> list[tuple[tuple[Any, ...], int, float]]:
    """(values of `keys`, tasks, GPUs they ask for) for tasks in `states`, grouped by `keys`
    (columns of the tasks table: pool, resource, team, ...); one indexed query."""
    columns = [getattr(TaskRow, key) for key in keys]
    query = (
        select(*columns, func.count(), func.coalesce(func.sum(TaskRow.gpus), 0.0))
        .where(TaskRow.state.in_([s.value for s in states]))
        .group_by(*columns)
    )
    with store.read() as session:
        return [(tuple(row[:-2]), int(row[-2]), float(row[-1])) for row in session.execute(query)]
