"""The queued tasks, kept between placement cycles: a cycle reads only the tasks the store
says changed since the last one (broker/store/changes.py), so that its cost does not grow with
the queue when little changes; everything is read again now and then, and whenever the store
cannot say what changed."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from broker.scheduler.model import QueuedTask
from broker.store.changes import ChangeReader
from broker.store.repository import QueuedRow, Store

FULL_EVERY_S = 300.0  # a full read even when the store says what changed


@dataclass
class QueueCache:
    store: Store
    full_every_s: float = FULL_EVERY_S
    tasks: dict[int, QueuedTask] = field(default_factory=dict)
    attempts: dict[int, int] = field(default_factory=dict)  # each task's attempts so far
    full_at: float = 0.0  # when everything was last read (monotonic)
    changes: ChangeReader = field(init=False)

    def __post_init__(self) -> None:
        self.changes = self.store.changes.reader()

    def current(self) -> list[QueuedTask]:
        """The queued tasks now. Blocking: call it from a thread."""
        changed = self.changes.take()  # before reading: a later change shows next time
        now = time.monotonic()
        if changed is None or now - self.full_at >= self.full_every_s:
            self.tasks, self.attempts = {}, {}
            self._add(self.store.queued())
            self.full_at = now
        elif changed:
            for task_id in changed:
                self.tasks.pop(task_id, None)
                self.attempts.pop(task_id, None)
            self._add(self.store.queued(changed))
        return list(self.tasks.values())

    def _add(self, rows: list[QueuedRow]) -> None:
        for row in rows:
            self.tasks[row.id] = QueuedTask(
                row.id, row.owner, row.team, row.resource, row.queued_at, row.skip_pools
            )
            self.attempts[row.id] = row.attempts
