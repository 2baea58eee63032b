"""A pool's held tasks as the agent API sends them (`GET /agent/pools/{pool}/tasks`), each
task's JSON encoded once per version of the task. A `klique agent` reads every task of its pool
at every look, about once a second, and few of them changed since its last: encoding them all
again was most of the control plane's CPU with a thousand jobs a pool (bench/estate_scale.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from broker.agents.wire import task_to_json
from broker.domain import Task


class EncodedTasks:
    """Each pool's tasks' JSON, kept while the task is the same object: the held-task cache
    (broker/control/held.py) replaces a task's object whenever the store says it changed."""

    def __init__(self) -> None:
        self._pools: dict[str, dict[int, tuple[Task, bytes]]] = {}

    def body(self, pool: str, tasks: Sequence[Task]) -> bytes:
        """The JSON array of `tasks`, as `[task_to_json(t) for t in tasks]` would encode."""
        kept = self._pools.get(pool, {})
        fresh: dict[int, tuple[Task, bytes]] = {}
        for task in tasks:
            seen = kept.get(task.id)
            if seen is None or seen[0] is not task:
                seen = (task, json.dumps(task_to_json(task), separators=(",", ":")).encode())
            fresh[task.id] = seen
        # Replaced whole, never changed in place: a look of the same pool in another thread
        # reads either the old map or the new one. Tasks the pool no longer holds leave with it.
        self._pools[pool] = fresh
        return b"[" + b",".join(encoded for _, encoded in fresh.values()) + b"]"
