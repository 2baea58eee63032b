"""The store: the only place that issues SQL. SQLite (WAL) by default, PostgreSQL by URL.

Every state change is one transaction that locks the task's row, checks the transition
against the state machine, writes the new state, its event and the ledger together.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, NamedTuple

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session, sessionmaker, undefer

from broker.domain import Task, TaskSpec, TaskState, transition
from broker.errors import NotFound
from broker.store.changes import TOUCHED, Changes, track
from broker.store.engine import WRITER, make_engine, normalise_url
from broker.store.leases import check_term
from broker.store.migrate import upgrade
from broker.store.notify import announce, announces
from broker.store.records import RecordMethods
from broker.store.rows import (
    event_of,
    queued_task,
    scalar_of,
    set_fields,
    skipped,
    tag_like,
    task_of,
    task_values,
)
from broker.store.tables import LedgerRow, ScalarRow, SweepRow, TaskEventRow, TaskRow


class Move(NamedTuple):
    """One task's change of state, as change_state makes it (Store.move_each makes many)."""

    task_id: int
    new: TaskState
    reason: str | None = None
    only_from: Sequence[TaskState] | None = None
    charged: bool = True
    fields: Mapping[str, Any] | None = None


class QueuedRow(NamedTuple):
    """A queued task as placement sees it."""

    id: int
    owner: str
    team: str | None
    resource: str
    queued_at: float
    skip_pools: frozenset[str]
    attempts: int


_STAMPS = {
    TaskState.QUEUED: "queued_at",
    TaskState.SUBMITTED: "submitted_at",
    TaskState.RUNNING: "started_at",
}


MOVES_AT_ONCE = 200  # move_each's transactions: the write lock is held for one at a time


class Store(RecordMethods):
    """The tasks, their events, the ledger and scalars; the other parts of the store (records,
    identity, apps, the web UI's queries) read and write through `read` and `write`."""

    def __init__(self, url: str) -> None:
        self.url = normalise_url(url)
        self.engine = make_engine(self.url)
        # `with store.read() as session`: a session that only reads (a snapshot, under WAL)
        self.read = sessionmaker(self.engine, expire_on_commit=False)
        self._writes = sessionmaker(
            self.engine.execution_options(**{WRITER: True}), expire_on_commit=False
        )
        # SQLite has one writer at a time, and a writer that finds the lock taken sleeps in
        # steps of up to 100 ms. Writers of this process queue here instead and go on the
        # moment the lock is free; other processes still meet SQLite's own lock.
        self._writer: AbstractContextManager[Any] = (
            threading.RLock() if self.url.startswith("sqlite") else nullcontext()
        )
        self.changes = Changes()  # the tasks written since the scheduler last looked
        # On PostgreSQL other replicas write too: each write says which tasks it changed, to
        # every replica's listener (broker/store/notify.py), in its own transaction.
        self.announces = announces(self.url)
        track(self._writes)

    @classmethod
    def open(cls, url: str) -> Store:
        """Open the store and bring its schema up to date."""
        store = cls(url)
        upgrade(store.engine)
        return store

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def write(self, term: int | None = None) -> Iterator[Session]:
        """A transaction that writes: committed at the end of the block, rolled back on error.
        With `term`, a leader's write that acts on the estate (placements, submissions): refused
        with Fenced, nothing written, unless the scheduler's lease still has that term."""
        with self._writer:
            with self._writes.begin() as session:
                if term is not None:
                    check_term(session, term)
                yield session
                if self.announces:
                    announce(session)
            self.changes.add(session.info.pop(TOUCHED, ()))  # committed

    # Tasks

    def create_task(
        self,
        spec: TaskSpec,
        owner: str,
        team: str | None,
        *,
        gpus: float = 0.0,
        state: TaskState = TaskState.QUEUED,
        reason: str = "",
        record: dict[str, Any] | None = None,
    ) -> Task:
        """A new task in `state`; `record` sets the SDK's fields (origin, parent, parameters,
        packages, inputs, cache key) and, for a task that runs locally, its pool."""
        transition(TaskState.CREATED, state)
        now = time.time()
        row = TaskRow(**task_values(spec, owner, team, gpus, state, reason, record or {}, now))
        with self.write() as session:
            session.add(row)
            session.flush()
            self._meter(session, row, TaskState.CREATED, state, now, charged=True)
            session.add(_created_event(row, now))
            return task_of(row)

    def create_queued(
        self,
        items: Sequence[tuple[TaskSpec, float, dict[str, Any]]],
        owner: str,
        team: str | None,
        sweep: str | None = None,
    ) -> tuple[int | None, list[Task]]:
        """Queued tasks, each (spec, GPUs, SDK fields as `create_task` takes them: parameters,
        parent, inputs...), in one transaction: all or none. With `sweep` (its name), a sweep
        row links them; returns its id (None without) and the tasks."""
        now = time.time()
        queued = TaskState.QUEUED
        values = [
            task_values(spec, owner, team, gpus, queued, "", record, now)
            for spec, gpus, record in items
        ]
        with self.write() as session:
            sweep_id = None
            if sweep is not None:
                size = len(values)
                found = SweepRow(owner=owner, team=team, name=sweep, size=size, created_at=now)
                session.add(found)
                session.flush()
                sweep_id = found.id
                for value in values:
                    value["sweep_id"] = sweep_id
            ids = _insert_queued(session, values, now)
        return sweep_id, [
            queued_task(task_id, spec, owner, team, gpus, record, value, sweep_id)
            for task_id, (spec, gpus, record), value in zip(ids, items, values, strict=True)
        ]

    def create_queued_each(
        self, items: Sequence[tuple[TaskSpec, float, str, str | None]]
    ) -> list[Task]:
        """Queued tasks of several owners, each (spec, GPUs, owner, team), in one transaction:
        the single creates of concurrent requests, written together."""
        now = time.time()
        queued = TaskState.QUEUED
        values = [
            task_values(spec, owner, team, gpus, queued, "", {}, now)
            for spec, gpus, owner, team in items
        ]
        with self.write() as session:
            ids = _insert_queued(session, values, now)
        return [
            queued_task(task_id, spec, owner, team, gpus, {}, value, None)
            for task_id, (spec, gpus, owner, team), value in zip(ids, items, values, strict=True)
        ]

    def queued(self, ids: Collection[int] | None = None) -> list[QueuedRow]:
        """The queued tasks (those of `ids`, when given) as placement sees them: a few columns,
        no spec parsed; a thousand ids a query."""
        columns = (
            TaskRow.id,
            TaskRow.owner,
            TaskRow.team,
            TaskRow.resource,
            func.coalesce(TaskRow.queued_at, TaskRow.created_at),
            TaskRow.skip_pools,
            TaskRow.attempts,
        )
        query = select(*columns).where(TaskRow.state == TaskState.QUEUED.value)
        chunks = [None] if ids is None else _chunks(sorted(ids), 1000)
        found: list[QueuedRow] = []
        with self.read() as session:
            for chunk in chunks:
                where = query if chunk is None else query.where(TaskRow.id.in_(chunk))
                found.extend(
                    QueuedRow(i, o, t, r, q, skipped(skip), a)
                    for i, o, t, r, q, skip, a in session.execute(where)
                )
        return found

    def sweep(self, sweep_id: int) -> dict[str, Any]:
        """A sweep's owner, team, name, size, and how many of its tasks are in each state."""
        with self.read() as session:
            row = session.get(SweepRow, sweep_id)
            if row is None:
                raise NotFound(f"no sweep {sweep_id}")
            query = select(TaskRow.state, func.count()).where(TaskRow.sweep_id == sweep_id)
            states = session.execute(query.group_by(TaskRow.state))
            return {
                "id": row.id,
                "owner": row.owner,
                "team": row.team,
                "name": row.name,
                "size": row.size,
                "created_at": row.created_at,
                "states": {state: n for state, n in states},
            }

    def counts(self) -> list[tuple[str, str | None, int, float | None]]:
        """How many tasks each (state, pool) holds, and when the longest-waiting of them first
        queued, from one grouped query: what /metrics reads at every scrape (broker/metrics.py)."""
        query = select(
            TaskRow.state, TaskRow.pool, func.count(), func.min(TaskRow.queued_at)
        ).group_by(TaskRow.state, TaskRow.pool)
        with self.read() as session:
            return [(state, pool, n, oldest) for state, pool, n, oldest in session.execute(query)]

    def get(self, task_id: int) -> Task:
        with self.read() as session:
            row = session.get(TaskRow, task_id)
            if row is None or row.deleted_at is not None:
                raise NotFound(f"no task {task_id}; `klique ls` lists your tasks")
            return task_of(row)

    def tasks(
        self,
        *,
        owner: str | None = None,
        states: Iterable[TaskState] | None = None,
        pool: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
        before: int | None = None,
        with_diff: bool = True,
        sweep: int | None = None,
        ids: Collection[int] | None = None,
        project: str | None = None,
        tag: str | None = None,
        archived: bool | None = None,
        team: str | None = None,
    ) -> list[Task]:
        """Tasks in id order (newest first if asked), from `before` down when paging; listings
        pass with_diff=False so that no stored diff is loaded. `ids`: only these. `tag`: those
        with this tag; `archived`: only archived ones (True) or none of them (False); `team`:
        those of this team."""
        query = select(TaskRow).where(TaskRow.deleted_at.is_(None))
        if ids is not None:
            query = query.where(TaskRow.id.in_(list(ids)))
        if before is not None:
            query = query.where(TaskRow.id < before)
        if owner is not None:
            query = query.where(TaskRow.owner == owner)
        if states is not None:
            query = query.where(TaskRow.state.in_([s.value for s in states]))
        if pool is not None:
            query = query.where(TaskRow.pool == pool)
        if project is not None:
            query = query.where(TaskRow.project == project)
        if sweep is not None:
            query = query.where(TaskRow.sweep_id == sweep)
        if tag is not None:
            query = query.where(TaskRow.tags.like(tag_like(tag), escape="\\"))
        if archived is not None:
            is_archived = TaskRow.archived_at.is_not(None)
            query = query.where(is_archived if archived else TaskRow.archived_at.is_(None))
        if team is not None:
            query = query.where(TaskRow.team == team)
        query = query.order_by(TaskRow.id.desc() if newest_first else TaskRow.id)
        if limit is not None:
            query = query.limit(limit)
        if with_diff:
            query = query.options(undefer(TaskRow.diff))
        with self.read() as session:
            return [task_of(row, with_diff) for row in session.scalars(query)]

    def change_state(
        self,
        task_id: int,
        new: TaskState,
        reason: str | None = None,
        *,
        only_from: Sequence[TaskState] | None = None,
        charged: bool = True,
        **fields: Any,
    ) -> Task | None:
        """Move a task to `new` (checked by the state machine) and set `fields`, atomically.

        With `only_from`, nothing changes (and None is returned) unless the task is in one of
        those states: callers that race with others (a cancel and a finishing job) use it.
        `charged` False: a running task's ledger run is paused (nodes booting, suspended).
        """
        now = time.time()
        with self.write() as session:
            row = session.get(TaskRow, task_id, with_for_update=True)
            if row is None:
                raise NotFound(f"no task {task_id}")
            return self._change(session, row, new, reason, only_from, charged, fields, now)

    def change_states(
        self,
        task_ids: Iterable[int],
        new: TaskState,
        reason: str,
        only_from: Sequence[TaskState],
        fields: Mapping[int, dict[str, Any]] | None = None,
        *,
        term: int | None = None,
    ) -> list[Task]:
        """change_state for many tasks in one transaction (a cycle's placements, cancelling a
        sweep's queued tasks), with each task's own `fields`; returns those that were in
        `only_from` and changed. `term`: a leader's write, fenced (see `write`)."""
        now = time.time()
        changed: list[Task] = []
        with self.write(term) as session:
            query = select(TaskRow).where(TaskRow.id.in_(list(task_ids))).with_for_update()
            rows = list(session.scalars(query))
            runs = _open_runs(session, [row.id for row in rows])
            for row in rows:
                own = dict((fields or {}).get(row.id, {}))
                args = (new, reason, only_from, True, own, now, runs.setdefault(row.id, []))
                done = self._change(session, row, *args)
                if done is not None:
                    changed.append(done)
        return changed

    def move_each(self, moves: Sequence[Move]) -> list[Task | None]:
        """change_state for many tasks, each its own move, in transactions of MOVES_AT_ONCE
        (a pool's look at many jobs): each the changed task, or None where nothing changed
        (a task not in its `only_from`, or no more)."""
        now = time.time()
        changed: list[Task | None] = []
        for start in range(0, len(moves), MOVES_AT_ONCE):
            chunk = moves[start : start + MOVES_AT_ONCE]
            with self.write() as session:
                query = select(TaskRow).where(TaskRow.id.in_([m.task_id for m in chunk]))
                query = query.order_by(TaskRow.id).with_for_update()  # locked in one order
                rows = {row.id: row for row in session.scalars(query)}
                runs = _open_runs(session, list(rows))
                for move in chunk:
                    row = rows.get(move.task_id)
                    if row is None:
                        changed.append(None)
                        continue
                    fields = dict(move.fields or {})
                    own_runs = runs.setdefault(row.id, [])
                    args = (move.new, move.reason, move.only_from, move.charged, fields, now)
                    changed.append(self._change(session, row, *args, own_runs))
        return changed

    def _change(
        self,
        session: Session,
        row: TaskRow,
        new: TaskState,
        reason: str | None,
        only_from: Sequence[TaskState] | None,
        charged: bool,
        fields: dict[str, Any],
        now: float,
        open_runs: list[LedgerRow] | None = None,
    ) -> Task | None:
        """One task's move, in the session: its fields, state, event and ledger runs. A batch
        passes each task's `open_runs`, read for all its tasks at once (else they are read
        here)."""
        task_id = row.id
        old = TaskState(row.state)
        if only_from is not None and old not in only_from:
            return None
        transition(old, new)
        set_fields(row, fields)
        if reason is not None:
            row.reason = reason
        elif old != new:
            row.reason = ""  # a reason belongs to the state it explained
        if old != new:
            row.state = new.value
            if new.final or new is TaskState.QUEUED:
                row.intent = None  # done with, or no longer the pool's to act on
            stamp = _STAMPS.get(new)
            if stamp == "queued_at" and row.queued_at is not None:
                stamp = None  # age counts from the first time it queued (requeues keep it)
            if stamp is not None:
                setattr(row, stamp, now)
            if new.final:
                row.finished_at = now
            session.add(
                TaskEventRow(
                    task_id=task_id,
                    time=now,
                    old_state=old.value,
                    new_state=new.value,
                    reason=row.reason,
                )
            )
        self._meter(session, row, old, new, now, charged, open_runs)
        row.updated_at = now
        return task_of(row)

    def report_digest(self, task_id: int) -> str | None:
        """The digest of the task's current report token; None for an unknown task."""
        with self.read() as session:
            return session.scalar(select(TaskRow.report_digest).where(TaskRow.id == task_id))

    def reported(self, task_id: int, valid: Callable[[str], bool]) -> Task | None:
        """The task a runner's report speaks for, in one read, where `valid` accepts its report
        token's digest ("" for an unknown task); else None, and no more work."""
        with self.read() as session:
            row = session.get(TaskRow, task_id)
            accepted = valid("" if row is None else row.report_digest or "")
            return task_of(row) if accepted and row is not None else None

    def update(self, task_id: int, **fields: Any) -> Task:
        """Set fields other than the state (native id, job dir, reason)."""
        changed = self.update_many({task_id: fields})
        if not changed:
            raise NotFound(f"no task {task_id}")
        return changed[0]

    def update_many(
        self,
        fields: Mapping[int, dict[str, Any]],
        only_in: Sequence[TaskState] | None = None,
        *,
        term: int | None = None,
    ) -> list[Task]:
        """update for many tasks in one transaction (a batch's attempts), each with its own
        fields; with `only_in`, only the tasks in one of those states. Returns those changed.
        `term`: a leader's write, fenced (see `write`)."""
        now = time.time()
        states = None if only_in is None else {s.value for s in only_in}
        changed: list[Task] = []
        with self.write(term) as session:
            query = select(TaskRow).where(TaskRow.id.in_(list(fields))).with_for_update()
            for row in session.scalars(query):
                if states is None or row.state in states:
                    set_fields(row, fields[row.id])
                    row.updated_at = now
                    changed.append(task_of(row))
        return changed

    def events(self, task_id: int) -> list[dict[str, Any]]:
        query = (
            select(TaskEventRow).where(TaskEventRow.task_id == task_id).order_by(TaskEventRow.id)
        )
        with self.read() as session:
            return [event_of(row) for row in session.scalars(query)]

    # Metering

    @staticmethod
    def _meter(
        session: Session,
        row: TaskRow,
        old: TaskState,
        new: TaskState,
        now: float,
        charged: bool,
        open_runs: list[LedgerRow] | None = None,
    ) -> None:
        """One open ledger run while a task runs and is charged; a pause closes it, a resume
        opens the next (a running task's phase may change without its state changing).
        `open_runs`, where given, are the task's open runs, kept current here."""
        if open_runs is None:
            open_runs = []
            if old is TaskState.RUNNING:
                open_runs = _open_runs(session, [row.id]).get(row.id, [])
        running = open_runs if old is TaskState.RUNNING else []
        if new is TaskState.RUNNING and charged:
            if running:
                return
            run = LedgerRow(
                task_id=row.id,
                owner=row.owner,
                team=row.team,
                project=row.project,
                resource=row.resource,
                pool=row.pool or "",
                gpus=row.gpus,
                start=now,
            )
            session.add(run)
            open_runs.append(run)
            return
        for run in running:
            run.end = now
            run.gpu_seconds = run.gpus * (now - run.start)
        running.clear()  # closed: the batch's later moves of this task see none open

    def ledger(self, since: float | None = None) -> list[LedgerRow]:
        query = select(LedgerRow).order_by(LedgerRow.start)
        if since is not None:
            query = query.where((LedgerRow.end.is_(None)) | (LedgerRow.end >= since))
        with self.read() as session:
            return list(session.scalars(query))

    # Scalars

    def add_scalars(self, task_id: int, scalars: Iterable[dict[str, Any]]) -> None:
        with self.write() as session:
            for s in scalars:
                session.add(
                    ScalarRow(
                        task_id=task_id,
                        name=str(s["name"]),
                        series=str(s.get("series") or ""),
                        value=float(s["value"]),
                        step=s.get("step"),
                        time=float(s.get("time") or time.time()),
                    )
                )

    def scalars(self, task_id: int) -> list[dict[str, Any]]:
        query = select(ScalarRow).where(ScalarRow.task_id == task_id).order_by(ScalarRow.id)
        with self.read() as session:
            return [scalar_of(row) for row in session.scalars(query)]


def _insert_queued(session: Session, values: list[dict[str, Any]], now: float) -> list[int]:
    """Insert queued tasks' rows and their creation events; their ids, in order. Multi-row
    INSERTs, no ORM objects: the cost of a task stays a small constant."""
    statement = insert(TaskRow).returning(TaskRow.id, sort_by_parameter_order=True)
    ids = list(session.connection().scalars(statement, values))
    created, queued = TaskState.CREATED.value, TaskState.QUEUED.value
    events = [{"task_id": i, "time": now, "old_state": created, "new_state": queued} for i in ids]
    session.connection().execute(insert(TaskEventRow), events)
    session.info.setdefault(TOUCHED, set()).update(ids)
    return ids


def _created_event(row: TaskRow, now: float) -> TaskEventRow:
    return TaskEventRow(
        task_id=row.id,
        time=now,
        old_state=TaskState.CREATED.value,
        new_state=row.state,
        reason=row.reason,
    )


def _chunks(items: list[int], size: int) -> list[list[int]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _open_runs(session: Session, task_ids: Sequence[int]) -> dict[int, list[LedgerRow]]:
    """The ledger runs of these tasks not yet ended, by task."""
    found: dict[int, list[LedgerRow]] = {}
    if task_ids:
        query = select(LedgerRow).where(LedgerRow.task_id.in_(task_ids), LedgerRow.end.is_(None))
        for run in session.scalars(query):
            found.setdefault(run.task_id, []).append(run)
    return found
