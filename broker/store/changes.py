"""Which tasks this process's store has changed since each of the scheduler's caches last asked,
so that a placement cycle or a pool's look reads only those instead of every queued or held
task.

Every write of this process goes through `Store.write`: a session hook notes the task rows each
transaction flushes, and the ids count once the transaction commits. Other replicas' writes
arrive through broker/store/notify.py (PostgreSQL). The scheduler still reloads everything now
and then, in case something else wrote to the database."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from itertools import chain
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from broker.store.tables import TaskRow

TOUCHED = "klique_tasks_touched"  # Session.info key: task ids this transaction wrote
_MOST = 1_000_000  # beyond this many unread changes, the reader reloads everything


class Changes:
    """Hands each reader (the queue, the held tasks) the ids written since its last take."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._readers: weakref.WeakSet[ChangeReader] = weakref.WeakSet()  # dropped with its cache

    def reader(self) -> ChangeReader:
        """A new reader; its first take says nothing is known (read everything)."""
        reader = ChangeReader(self._lock)
        with self._lock:
            self._readers.add(reader)
        return reader

    def add(self, ids: Iterable[int]) -> None:
        ids = set(ids)
        with self._lock:
            for reader in self._readers:
                reader.note(ids)

    def forget(self) -> None:
        """Anything may have changed (writes another replica made were not heard): every
        reader's next take says so, and its cache reads everything."""
        with self._lock:
            for reader in self._readers:
                reader.forget()


class ChangeReader:
    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock  # its Changes' own
        self._ids: set[int] | None = None  # None: not known (at start) -> reload everything

    def note(self, ids: set[int]) -> None:
        """Called by Changes.add, under the lock."""
        if self._ids is not None:
            self._ids.update(ids)
            if len(self._ids) > _MOST:
                self._ids = None

    def forget(self) -> None:
        """Called by Changes.forget, under the lock."""
        self._ids = None

    def take(self) -> set[int] | None:
        """The ids changed since the last take; None when unknown (read everything)."""
        with self._lock:
            ids, self._ids = self._ids, set()
            return ids


def track(sessions: sessionmaker[Session]) -> None:
    """Note the task rows each flush of these sessions writes, in the session's info."""

    @event.listens_for(sessions, "after_flush")
    def _touched(session: Session, _context: Any) -> None:
        rows = chain(session.new, session.dirty)
        ids = {row.id for row in rows if isinstance(row, TaskRow)}
        if ids:
            session.info.setdefault(TOUCHED, set()).update(ids)
