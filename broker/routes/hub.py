"""The route hub: the apps' tunnels (one per running app, opened by its runner), which route
each serves, and which of them take requests. Requests to a route are spread over its ready
instances in turn; a route with none waits for one up to a switch-over window.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker.apps.launch import APPLICATION, COUNTED
from broker.routes.auth import RouteInfo
from broker.scheduler.loop import Scheduler
from inside_job import frames

SWITCH_WINDOW_S = 30.0  # how long a request waits for an instance of its route to be ready
DRAIN_S = 10.0  # how long a stopping instance finishes what it has in flight
_TABLE_TTL_S = 1.0


class InstanceGone(Exception):
    """The instance's tunnel ended, or the app refused the stream, before it answered."""


@dataclass
class Instance:
    """One running app, connected by its tunnel."""

    task_id: int
    route: str
    path: str  # keep | strip: whether the app sees the route's prefix
    send_frame: Callable[[bytes], Any]  # an async function sending one binary message
    ready: bool = False
    draining: bool = False
    in_flight: int = 0
    streams: dict[int, asyncio.Queue[tuple[int, bytes]]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def send(self, frame: bytes) -> None:
        async with self._lock:
            await self.send_frame(frame)

    def open_stream(self) -> tuple[int, asyncio.Queue[tuple[int, bytes]]]:
        stream = next(self._ids)
        inbox: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
        self.streams[stream] = inbox
        self.in_flight += 1
        return stream, inbox

    def close_stream(self, stream: int) -> None:
        if self.streams.pop(stream, None) is not None:
            self.in_flight -= 1

    def deliver(self, stream: int, kind: int, payload: bytes) -> None:
        inbox = self.streams.get(stream)
        if inbox is not None:
            inbox.put_nowait((kind, payload))

    def fail_all(self) -> None:
        gone = json.dumps({"code": 1001, "reason": "the app's tunnel closed"}).encode()
        for inbox in self.streams.values():
            inbox.put_nowait((frames.CLOSE, gone))


class Hub:
    """Tunnels by connection: a runner that connects again (a dropped network) is one more
    connection of its task until the old one is seen gone."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.instances: dict[int, Instance] = {}  # by id() of the Instance
        self._changed = asyncio.Event()
        self._turn: dict[str, int] = {}
        self._table: dict[str, RouteInfo] = {}
        self._active: set[int] = set()
        self._table_at = 0.0

    # The tunnels.

    def register(self, instance: Instance) -> None:
        self.instances[id(instance)] = instance
        self._notify()

    def unregister(self, instance: Instance) -> None:
        instance.fail_all()
        self.instances.pop(id(instance), None)
        self._notify()

    def mark_ready(self, instance: Instance) -> None:
        instance.ready = True
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def of_task(self, task_id: int) -> list[Instance]:
        return [i for i in self.instances.values() if i.task_id == task_id]

    def is_ready(self, task_id: int) -> bool:
        return any(i.ready for i in self.of_task(task_id))

    def instances_of(self, route: str) -> list[int]:
        return sorted({i.task_id for i in self.instances.values() if i.route == route})

    def ready_of(self, route: str) -> list[int]:
        return [i for i in self.instances_of(route) if self.is_ready(i)]

    # The routes.

    def forget_routes(self) -> None:
        """A launch or a route changed: read the table again at the next request."""
        self._table_at = 0.0

    def route_info(self, name: str) -> RouteInfo | None:
        self._refresh()
        return self._table.get(name)

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._table_at < _TABLE_TTL_S:
            return
        from broker.api.apps import static_routes

        table: dict[str, RouteInfo] = {
            r.name: RouteInfo(r.name, "endpoint", frozenset(), frozenset(r.teams), True)
            for r in static_routes(self.scheduler).values()
        }
        active: set[int] = set()
        store = self.scheduler.store
        for task in store.tasks(states=COUNTED, with_diff=False):
            app = task.spec.app
            if task.spec.kind != APPLICATION or not app:
                continue
            active.add(task.id)
            name = str(app.get("route"))
            if app.get("static"):
                continue
            table[name] = RouteInfo(
                name,
                str(app.get("kind")),
                frozenset({task.owner}),
                frozenset(app.get("teams") or ()),
                False,
            )
        self._table, self._active, self._table_at = table, active, now

    async def pick(
        self, route: str, deadline: float, exclude: set[int] | frozenset[int] = frozenset()
    ) -> Instance | None:
        """The next ready instance of the route in turn, waiting for one until deadline."""
        while True:
            self._refresh()
            ready = sorted(
                (
                    i
                    for i in list(self.instances.values())
                    if i.route == route
                    and i.ready
                    and not i.draining
                    and i.task_id in self._active
                    and i.task_id not in exclude
                ),
                key=lambda i: i.task_id,
            )
            if ready:
                turn = self._turn.get(route, 0)
                self._turn[route] = turn + 1
                return ready[turn % len(ready)]
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            changed = self._changed
            # A tunnel's change wakes us; the table's changes are seen within its TTL.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(left, _TABLE_TTL_S))

    async def drain(self, task_id: int, within_s: float = DRAIN_S) -> None:
        """Take the task's instances out of its route and let what they have in flight finish."""
        instances = self.of_task(task_id)
        for instance in instances:
            instance.draining = True
        self._notify()
        deadline = time.monotonic() + within_s
        while any(i.in_flight for i in instances) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
