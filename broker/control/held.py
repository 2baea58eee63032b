"""The tasks the pools hold (placed, submitted, pending, running), kept between reads as the
queue is (broker/control/queue.py): each pool's look and each placement cycle read only the
tasks the store says changed since the last read, rather than every held task, and everything
is read again now and then, whenever the store cannot say what changed, and when more changed
than the pools can hold (a large sweep made)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from broker.domain import Task, TaskState
from broker.store.changes import ChangeReader
from broker.store.repository import Store

FULL_EVERY_S = 60.0  # a full read even when the store says what changed
MOST_CHANGED = 1000  # beyond this many changed tasks (a large sweep made), a full read is less


@dataclass
class HeldTasks:
    store: Store
    states: Sequence[TaskState]  # those a pool holds a task in
    full_every_s: float = FULL_EVERY_S
    tasks: dict[int, Task] = field(default_factory=dict)
    full_at: float = 0.0  # when everything was last read (monotonic)
    changes: ChangeReader = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.changes = self.store.changes.reader()

    def current(self, pool: str | None = None) -> list[Task]:
        """The held tasks now (a pool's only, if named), in id order. Blocking: call it from a
        thread; the pools' agents and the placement cycle may call it at once."""
        with self._lock:
            changed = self.changes.take()  # before reading: a later change shows next time
            now = time.monotonic()
            stale = now - self.full_at >= self.full_every_s
            if changed is None or len(changed) > MOST_CHANGED or stale:
                self.tasks = {t.id: t for t in self.store.tasks(states=self.states)}
                self.full_at = now
            elif changed:
                for task_id in changed:
                    self.tasks.pop(task_id, None)
                for task in self.store.tasks(states=self.states, ids=changed):
                    self.tasks[task.id] = task
            held = sorted(self.tasks.items())
        return [task for _, task in held if pool is None or task.pool == pool]
