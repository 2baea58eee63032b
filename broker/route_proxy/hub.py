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

from broker.control.loop import ControlLoop
from broker.route_proxy.access import RouteInfo
from broker.tasks.apps import running_apps, static_routes
from inside_job import frames

SWITCH_WINDOW_S = 30.0  # how long a request waits for an instance of its route to be ready
DRAIN_S = 10.0  # how long a stopping instance finishes what it has in flight
_TABLE_TTL_S = 1.0
MAX_STREAMS = 256  # streams in flight on one tunnel; more are refused, never queued
CONTROLS_HELD = 4  # a stream's control frames (RESPONSE, END, ...) held for its consumer


class InstanceGone(Exception):
    """The instance's tunnel ended, or the app refused the stream, before it answered."""


class StreamsFull(Exception):
    """The instance has MAX_STREAMS streams in flight already."""


@dataclass
class Stream:
    """One request or WebSocket on a tunnel, flow-controlled both ways: what the app sends
    waits in `inbox` for the caller, at most a window of it (frames.ReceiveWindow); what the
    caller sends goes down the tunnel as the runner grants credit (frames.SendWindow)."""

    id: int
    inbox: asyncio.Queue[tuple[int, bytes]] = field(default_factory=asyncio.Queue)
    received: frames.ReceiveWindow = field(default_factory=frames.ReceiveWindow)
    sending: frames.SendWindow = field(default_factory=frames.SendWindow)
    controls: int = 0  # control frames in the inbox
    closed: bool = False  # by the app, the tunnel's end, or a broken protocol
    sent_end: bool = False  # the request's body went whole to the app
    _credit: asyncio.Event = field(default_factory=asyncio.Event)

    async def take(self) -> tuple[int, bytes]:
        """The app's next frame on this stream, in order."""
        kind, payload = await self.inbox.get()
        if kind not in frames.DATA:
            self.controls -= 1
        return kind, payload

    def hold(self, kind: int, payload: bytes) -> str | None:
        """Keep a frame for the consumer; why the stream must close instead, if it must."""
        if self.closed:
            return None  # what comes after a close is dropped, never held
        if kind == frames.WINDOW:
            try:
                self.sending.grant(frames.window_increment(payload))
            except ValueError as exc:
                return str(exc)
            self._credit.set()
            return None
        if kind in frames.DATA:
            if not self.received.receive(len(payload), message=kind != frames.BODY):
                return "the app sent past the stream's window"
        elif self.controls >= CONTROLS_HELD:
            return "the app sent more control frames than the stream takes"
        else:
            self.controls += 1
        self.inbox.put_nowait((kind, payload))
        if kind == frames.CLOSE:
            self.end()
        return None

    def end(self, why: bytes | None = None) -> None:
        """No more frames from the app; `why` (a CLOSE payload) tells the consumer so."""
        self.closed = True
        if why is not None:
            self.controls += 1
            self.inbox.put_nowait((frames.CLOSE, why))
        self._credit.set()  # a sender waiting for credit learns the stream is over

    async def credit(self) -> None:
        """Until the runner grants more credit, or the stream ends."""
        self._credit.clear()
        await self._credit.wait()


def close_payload(code: int, reason: str) -> bytes:
    return json.dumps({"code": code, "reason": reason}).encode()


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
    streams: dict[int, Stream] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def send(self, frame: bytes) -> None:
        async with self._lock:
            await self.send_frame(frame)

    def open_stream(self) -> Stream:
        """A new stream; StreamsFull when MAX_STREAMS are in flight."""
        if len(self.streams) >= MAX_STREAMS:
            raise StreamsFull(f"the app has {MAX_STREAMS} requests in flight")
        stream = Stream(next(self._ids))
        self.streams[stream.id] = stream
        self.in_flight += 1
        return stream

    def close_stream(self, stream: int) -> None:
        if self.streams.pop(stream, None) is not None:
            self.in_flight -= 1

    def deliver(self, stream: int, kind: int, payload: bytes) -> str | None:
        """A frame from the runner, never waiting: held within the stream's window. Returns why
        the stream must be closed when the runner broke the protocol (it is then ended here and
        its caller told); the tunnel tells the runner."""
        found = self.streams.get(stream)
        if found is None:
            return None
        problem = found.hold(kind, payload)
        if problem is not None:
            found.end(close_payload(1008, problem))
        return problem

    def buffered(self) -> int:
        """Bytes of the apps' data held for callers, over all streams."""
        return sum(s.received.held for s in self.streams.values())

    async def send_message(self, stream: Stream, kind: int, data: bytes) -> None:
        """One WebSocket message to the app, once the stream's window allows it."""
        while not stream.sending.allows(len(data)):
            if stream.closed:
                raise InstanceGone("the stream ended")
            await stream.credit()
        stream.sending.spend(len(data))
        await self.send(frames.encode(stream.id, kind, data))

    async def send_body(self, stream: Stream, data: bytes, chunk: int) -> None:
        """A piece of a request's body to the app, in pieces the window allows as it opens."""
        view = memoryview(data)
        while view:
            if stream.closed:
                raise InstanceGone("the stream ended")
            room = min(stream.sending.room(), chunk)
            if not room:
                await stream.credit()
                continue
            piece, view = view[:room], view[room:]
            stream.sending.spend(len(piece))
            await self.send(frames.encode(stream.id, frames.BODY, bytes(piece)))

    async def passed_on(self, stream: Stream, n: int) -> None:
        """n bytes of the app's data reached the caller: grant them back to the runner."""
        grant = stream.received.passed_on(n)
        if grant and not stream.closed:
            with contextlib.suppress(OSError, RuntimeError):  # a tunnel gone needs no credit
                await self.send(frames.encode_window(stream.id, grant))

    def fail_all(self) -> None:
        gone = close_payload(1001, "the app's tunnel closed")
        for stream in self.streams.values():
            if not stream.closed:
                stream.end(gone)


class Hub:
    """Tunnels by connection: a runner that connects again (a dropped network) is one more
    connection of its task until the old one is seen gone."""

    def __init__(self, control: ControlLoop) -> None:
        self.control = control
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
        table: dict[str, RouteInfo] = {
            r.name: RouteInfo(r.name, "endpoint", frozenset(), frozenset(r.teams), True)
            for r in static_routes(self.control).values()
        }
        active: set[int] = set()
        for task in running_apps(self.control):
            app = task.spec.app
            if not app:
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
