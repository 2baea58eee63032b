"""Live updates: one server-sent-events connection per page; the server looks at the store
once per tick and sends only what changed, as HTML fragments that htmx swaps in by name
(`task-ID` rows, `task-new`, `summary`, `timeline`, `why`, `console`, `pools`) or as JSON
(`scalars`) that the page's charts append.

A stream ends after STREAM_S (the browser reconnects on its own, sending the last event id,
which carries the page's cursor), so that no connection outlives a server restart for long.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from markupsafe import escape

from broker.domain import Task, TaskState
from broker.errors import NotFound
from broker.http.paths import TaskId
from broker.store import web as web_store
from broker.tasks.console import read_console
from broker.tasks.views import task_out, why_out
from broker.web.pages_estate import resources_context
from broker.web.pages_tasks import task_filter
from broker.web.render import fragment
from broker.web.ui import Viewer, Web
from inside_job.reporter import decode_prefix

TICK_S = 1.0
STREAM_S = 30.0
OVERLAP_S = 2.0  # changes are read again this far back: a transaction may commit late
CHANGES = 2000  # changed tasks read per tick
_LINES = re.compile(r"\r\n|\r|\n")


def event(name: str, data: str, cursor: str | None = None) -> str:
    """One SSE event; every line of `data` gets its own `data:` field."""
    head = f"event: {name}\n" + (f"id: {cursor}\n" if cursor is not None else "")
    return head + "".join(f"data: {line}\n" for line in _LINES.split(data)) + "\n"


def _json(value: Any) -> str:
    """JSON with <, > and & escaped, as Jinja's tojson does: never markup, wherever it lands."""
    text = json.dumps(value)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _ints(text: str) -> list[int]:
    return [int(w) for w in text.split(",") if w.isdigit() and int(w) < 2**63][:1000]


def _float(text: str | None, default: float) -> float:
    try:
        value = float(text or "")
    except ValueError:
        return default
    return value if value == value and abs(value) < 1e12 else default


class TaskListStream:
    """The rows of one task-list page: rows it shows change; new tasks that match its filter
    come in at the top of its first page."""

    def __init__(self, web: Web, request: Request, who: Viewer) -> None:
        self.web = web
        self.who = who
        self.where, _ = task_filter(request, who)
        params = request.query_params
        self.first_page = params.get("page") == "first"
        self.top = int(params.get("top", "0")) if params.get("top", "").isdigit() else 0
        self.drawn_top = self.top  # rows above it came live: after a reconnect they are shown
        owner = self.where.owner
        self.shown = {
            t.id: t for t in web_store.tasks_by_id(web.store, _ints(params.get("ids", "")), owner)
        }
        since, _, top = (request.headers.get("last-event-id") or "").partition(":")
        self.since = _float(since or params.get("since"), time.time())
        self.top = max(self.top, int(top) if top.isdigit() and len(top) < 19 else 0)
        self.stamps: dict[int, float] = {}
        self.overlap = OVERLAP_S
        # The reasons as the page drew them: a row is sent again only when its reason changes.
        self.reasons = {t.id: task_out(t, web.control).reason for t in self.shown.values()}

    def row(self, task: Task) -> str:
        out = task_out(task, self.web.control)
        self.reasons[task.id] = out.reason
        return fragment("_task_row.html", t=out, who=self.who)

    def cursor(self) -> str:
        return f"{self.since!r}:{self.top}"

    def tick(self) -> list[str]:
        events = []
        changed = web_store.changed_since(
            self.web.store, self.since - self.overlap, self.where.owner, CHANGES
        )
        # A full batch: read on from its end without going back, so that a burst of changes
        # larger than a batch cannot hold the stream in place.
        self.overlap = 0.0 if len(changed) == CHANGES else OVERLAP_S
        for task, stamp in changed:
            if self.stamps.get(task.id) == stamp:
                continue
            self.stamps[task.id] = stamp
            self.since = max(self.since, stamp)
            events += self.redraw(task)
        self.stamps = {i: s for i, s in self.stamps.items() if s > self.since - OVERLAP_S}
        for task in self.shown.values():
            if task.state is TaskState.QUEUED:
                reason = task_out(task, self.web.control).reason
                if reason != self.reasons.get(task.id):
                    events.append(event(f"task-{task.id}", self.row(task), self.cursor()))
        return events

    def redraw(self, task: Task) -> list[str]:
        live_row = self.first_page and self.drawn_top < task.id <= self.top
        if task.id in self.shown or (live_row and self.where.matches(task)):
            self.shown[task.id] = task
            return [event(f"task-{task.id}", self.row(task), self.cursor())]
        if self.first_page and task.id > self.top and self.where.matches(task):
            self.shown[task.id] = task
            self.top = task.id
            return [event("task-new", self.row(task), self.cursor())]
        return []


class TaskStream:
    """One task's page: its summary and timeline when it changes, why it waits, its console
    from where the page stopped, and new scalars."""

    def __init__(self, web: Web, request: Request, who: Viewer, task: Task) -> None:
        self.web = web
        self.task = task
        self.context = {"csrf": who.csrf, "features": web.features(request)}
        params = request.query_params
        cursor = (request.headers.get("last-event-id") or "").split(":")
        if len(cursor) == 2 and all(c.isdigit() for c in cursor):
            self.offset, self.scalar = int(cursor[0]), int(cursor[1])
        else:
            self.offset = (
                int(params.get("offset", "0")) if params.get("offset", "").isdigit() else 0
            )
            self.scalar = (
                int(params.get("scalars", "0")) if params.get("scalars", "").isdigit() else 0
            )
        # The task as the page drew it; a stream opened without it redraws the task once.
        self.stamp = _float(params.get("stamp"), 0.0) or None
        self.why = self.why_html()  # as the page drew it: sent again only when it changes
        self.done = False

    def why_html(self) -> str:
        return fragment("_task_why.html", task=self.task, why=why_out(self.web.control, self.task))

    def cursor(self) -> str:
        return f"{self.offset}:{self.scalar}"

    async def tick(self) -> list[str]:
        events = []
        stamp = web_store.updated_at(self.web.store, self.task.id)
        if stamp != self.stamp:
            self.stamp = stamp
            self.task = self.web.store.get(self.task.id)
            out = task_out(self.task, self.web.control, detail=True)
            summary = fragment("_task_summary.html", task=out, **self.context)
            events.append(event("summary", summary, self.cursor()))
            events.append(
                event("timeline", fragment("_task_timeline.html", task=out), self.cursor())
            )
        why = self.why_html()
        if why != self.why:
            self.why = why
            events.append(event("why", why, self.cursor()))
        events += await self.console()
        new = web_store.scalars_after(self.web.store, [self.task.id], self.scalar)
        if new:
            self.scalar = new[-1]["id"]
            events.append(event("scalars", _json(new), self.cursor()))
        return events

    async def console(self) -> list[str]:
        final = self.task.state.final
        data = await read_console(self.web.control, self.task, self.offset)
        text, used = decode_prefix(data, final and len(data) < (1 << 20))
        self.offset += used
        if final and not data:
            self.done = True
        if not text:
            return []
        return [event("console", f"<span>{escape(text)}</span>", self.cursor())]


async def _stream(request: Request, tick: Any, done: Any = lambda: False) -> AsyncIterator[str]:
    yield "retry: 1000\n\n"
    ends = time.monotonic() + STREAM_S
    while time.monotonic() < ends and not await request.is_disconnected():
        result = tick()
        for item in await result if asyncio.iscoroutine(result) else result:
            yield item
        if done():
            yield event("done", "")
            return
        await asyncio.sleep(TICK_S)


def _sse(body: AsyncIterator[str]) -> StreamingResponse:
    headers = {
        "Cache-Control": "no-store",
        "X-Accel-Buffering": "no",
        "X-Content-Type-Options": "nosniff",
    }
    return StreamingResponse(body, media_type="text/event-stream", headers=headers)


def add_routes(router: APIRouter, web: Web) -> None:
    @router.get("/events/tasks")
    def task_list_events(request: Request) -> StreamingResponse:
        stream = TaskListStream(web, request, web.viewer(request))
        return _sse(_stream(request, stream.tick))

    @router.get("/events/tasks/{task_id}")
    def task_events(request: Request, task_id: TaskId) -> StreamingResponse:
        who = web.viewer(request)
        try:
            task = web.task(who, task_id)
        except NotFound:
            return _sse(_gone())
        stream = TaskStream(web, request, who, task)
        return _sse(_stream(request, stream.tick, lambda: stream.done))

    @router.get("/events/pools")
    def pool_events(request: Request) -> StreamingResponse:
        who = web.viewer(request)
        last = {"html": ""}

        def tick() -> list[str]:
            html = fragment("_pools.html", **resources_context(web.control, who), who=who)
            if html == last["html"]:
                return []
            last["html"] = html
            return [event("pools", html)]

        return _sse(_stream(request, tick))


async def _gone() -> AsyncIterator[str]:
    """A task that is not the viewer's: the same silence as a missing one, then the end."""
    yield event("done", "")
