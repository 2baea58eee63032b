"""The task pages: the live list (filters, search, paging, multi-select cancel), one task (its
timeline, console, scalars, code, where it ran, why it waits), clone, and compare."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError

from broker.authz import Action, owner_filter
from broker.domain import Task, TaskState
from broker.errors import KliqueError, NotFound
from broker.http.errors import status_of
from broker.http.paths import TaskId
from broker.store import web as web_store
from broker.tasks import reports as task_reports
from broker.tasks.apps import AppService, clone_task
from broker.tasks.cancelling import cancel_task
from broker.tasks.console import read_console
from broker.tasks.keeping import TAG
from broker.tasks.schemas import TaskOut
from broker.tasks.sdk_schemas import CloneIn
from broker.tasks.views import task_out, why_out
from broker.web.render import HEADERS
from broker.web.reports_view import reports_view
from broker.web.ui import Viewer, Web, safe_next
from inside_job.reporter import decode_prefix

PAGE = 100
DIFF_LINES = 5000  # lines of an uncommitted diff shown on the page
MAX_COMPARE = 8


def task_filter(request: Request, who: Viewer) -> tuple[web_store.TaskFilter, list[str]]:
    """The list's filter from the query string, and what in it was not understood."""
    params = request.query_params
    problems = []
    known = {s.value for s in TaskState}
    states = []
    for value in params.getlist("state"):
        if value in known:
            states.append(TaskState(value))
        elif value:
            problems.append(f"unknown state {value!r} left out")
    tag = (params.get("tag") or "").strip()
    if tag and not re.fullmatch(TAG, tag):
        problems.append(f"tag {tag[:64]!r} is no tag (letters, digits and ._:+=@/-): left out")
        tag = ""
    team = who.team if params.get("team") and who.team else None
    if params.get("team") and who.team is None:
        problems.append("you are in no team: showing your own tasks")
    where = web_store.TaskFilter(
        owner=None if team else owner_filter(who, params.get("owner") or None),
        states=tuple(states),
        project=params.get("project") or None,
        search=(params.get("q") or "").strip()[:200],
        tag=tag or None,
        team=team,
        archived=bool(params.get("archived")),
    )
    return where, problems


def task_ids(values: list[str]) -> list[int]:
    """Task ids from form fields or a query ("3 4,5"): digits only, within the API's range."""
    words = " ".join(values).replace(",", " ").split()
    return [int(w) for w in words if w.isdigit() and 0 < int(w) < 2**63]


def _before(request: Request) -> int | None:
    value = request.query_params.get("before", "")
    return int(value) if value.isdigit() and 0 < int(value) < 2**63 else None


def list_context(web: Web, request: Request, who: Viewer) -> dict[str, Any]:
    where, problems = task_filter(request, who)
    before = _before(request)
    since = time.time()  # before the read: the live stream sends what changes from here
    found = web_store.task_page(web.store, where, before, PAGE)
    rows = [task_out(t, web.control) for t in found.tasks]
    query: list[tuple[str, str | int | float | bool | None]] = [
        (k, v) for k, v in request.query_params.multi_items() if k != "before"
    ]
    return {
        "rows": rows,
        "where": where,
        "problems": problems,
        "before": before,
        "next_before": found.next_before,
        "searched_to": found.searched_to,
        "states": [s.value for s in TaskState if s is not TaskState.CREATED],
        "projects": web_store.projects(web.store, owner_filter(who)),
        "owners": web_store.owners(web.store) if who.admin else [],
        "query": httpx.QueryParams(query),
        "since": repr(since),
    }


def _diff_lines(diff: str) -> tuple[list[tuple[str, str]], int]:
    """(css class, line) for the first DIFF_LINES lines, and how many lines there are."""
    lines = diff.splitlines()
    shown = []
    for line in lines[:DIFF_LINES]:
        if line.startswith(("diff --git", "+++", "---", "index ")):
            kind = "file"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = ""
        shown.append((kind, line))
    return shown, len(lines)


async def console_text(web: Web, task: Task) -> tuple[str, int]:
    data = await read_console(web.control, task, 0)
    text, used = decode_prefix(data, task.state.final)
    return text, used


def chart_data(outs: list[TaskOut]) -> dict[str, Any]:
    """One chart per scalar title, steps on x (the order when no step). One task: a line per
    series (a title's own points: the title's line). Several: a chart per title and series,
    a line per task."""
    charts: dict[str, dict[str, list[list[float]]]] = {}
    for out in outs:
        for i, s in enumerate(out.scalars):
            series = s.get("series") or ""
            x = s["step"] if s["step"] is not None else i
            if len(outs) == 1:
                chart, line = s["name"], series or s["name"]
            else:
                chart = f"{s['name']} / {series}" if series else s["name"]
                line = f"task {out.id}"
            charts.setdefault(chart, {}).setdefault(line, []).append([x, s["value"]])
    return {
        "charts": [
            {"name": n, "series": [{"label": k, "points": p} for k, p in lines.items()]}
            for n, lines in sorted(charts.items())
        ]
    }


def _differs(values: list[Any]) -> bool:
    return len({json.dumps(v, sort_keys=True, default=str) for v in values}) > 1


def compare_rows(outs: list[TaskOut]) -> list[tuple[str, list[Any], bool]]:
    """(field, value per task, whether they differ), parameters first when the API has them."""
    rows: list[tuple[str, list[Any], bool]] = []
    params = [getattr(o, "parameters", None) or {} for o in outs]
    for key in sorted({k for p in params for k in p}):
        values = [p.get(key, "-") for p in params]
        rows.append((f"parameter {key}", values, _differs(values)))
    for key in ("name", "project", "resource", "state", "pool", "exit_code", "owner"):
        values = [getattr(o, key) for o in outs]
        rows.append((key, values, _differs(values)))
    commands = [" ".join(o.command) for o in outs]
    rows.append(("command", commands, _differs(commands)))
    code = [f"{o.code['repo']}@{o.code['commit']}" if o.code else "-" for o in outs]
    rows.append(("code", code, _differs(code)))
    return rows


def add_routes(router: APIRouter, web: Web) -> None:
    control = web.control

    @router.get("/")
    def home(request: Request) -> Response:
        web.viewer(request)
        return RedirectResponse("/tasks", status_code=303, headers=HEADERS)

    @router.get("/tasks")
    def tasks(request: Request) -> HTMLResponse:
        who = web.viewer(request)
        return web.page(request, who, "tasks.html", **list_context(web, request, who))

    @router.get("/tasks/{task_id}")
    async def task(request: Request, task_id: TaskId) -> HTMLResponse:
        who = web.viewer(request)
        stamp = web_store.updated_at(web.store, task_id)  # before the read: the stream goes on
        try:
            found = web.task(who, task_id)
        except NotFound as exc:
            return web.error(request, who, 404, str(exc))
        out = task_out(found, control, detail=True)
        out.scalars = web_store.scalars_after(web.store, [found.id])  # with ids: the cursor
        console, offset = await console_text(web, found)
        diff, diff_total = _diff_lines(found.spec.code.diff if found.spec.code else "")
        return web.page(
            request,
            who,
            "task.html",
            task=out,
            why=why_out(control, found),
            console=console,
            offset=offset,
            diff=diff,
            diff_total=diff_total,
            charts=chart_data([out]),
            reports=reports_view(task_reports.listing(control, found, None)),
            scalar_cursor=out.scalars[-1]["id"] if out.scalars else 0,
            stamp=repr(stamp),
        )

    @router.post("/tasks/{task_id}/cancel")
    async def cancel(request: Request, task_id: TaskId) -> Response:
        who, form = await web.posted(request)
        try:
            found = web.task(who, task_id, Action.CANCEL)
        except NotFound as exc:
            return web.error(request, who, 404, str(exc))
        await cancel_task(control, found)  # as the API does: a pipeline's steps too
        back = safe_next(str(form.get("back") or f"/tasks/{task_id}"))
        return RedirectResponse(back, status_code=303, headers=HEADERS)

    @router.post("/tasks/cancel")
    async def cancel_many(request: Request) -> Response:
        who, form = await web.posted(request)
        ids = task_ids([v for v in form.getlist("id") if isinstance(v, str)])
        missing = []
        for task_id in ids[:1000]:
            try:
                found = web.task(who, task_id, Action.CANCEL)
            except NotFound:
                missing.append(str(task_id))
                continue
            await cancel_task(control, found)
        if missing:
            return web.error(
                request, who, 404, f"no task {', '.join(missing)} of yours; nothing done to them"
            )
        back = safe_next(str(form.get("back") or "/tasks"))
        return RedirectResponse(back, status_code=303, headers=HEADERS)

    @router.get("/compare")
    def compare(request: Request) -> HTMLResponse:
        who = web.viewer(request)
        wanted = task_ids(request.query_params.getlist("ids"))[:MAX_COMPARE]
        outs, problems = [], []
        for task_id in dict.fromkeys(wanted):
            try:
                found = web.task(who, task_id)
            except NotFound as exc:
                problems.append(str(exc))
                continue
            outs.append(task_out(found, control, detail=True))
        return web.page(
            request,
            who,
            "compare.html",
            tasks=outs,
            ids=" ".join(str(i) for i in wanted),
            problems=problems,
            rows=compare_rows(outs) if len(outs) > 1 else [],
            charts=chart_data(outs),
        )

    @router.get("/tasks/{task_id}/clone")
    def clone_form(request: Request, task_id: TaskId) -> HTMLResponse:
        who = web.viewer(request)
        try:
            out = task_out(web.task(who, task_id), control)
        except NotFound as exc:
            return web.error(request, who, 404, str(exc))
        if not web.features(request).clone:
            return web.error(request, who, 404, "this server's API has no clone yet")
        return web.page(request, who, "clone.html", task=out, error="")

    @router.post("/tasks/{task_id}/clone")
    async def clone(request: Request, task_id: TaskId) -> Response:
        who, form = await web.posted(request)
        try:
            out = task_out(web.task(who, task_id, Action.CLONE), control)
        except NotFound as exc:
            return web.error(request, who, 404, str(exc))
        if not web.features(request).clone:
            return web.error(request, who, 404, "this server's API has no clone yet")
        params = edited_parameters(getattr(out, "parameters", None) or {}, form)
        tasks = request.app.state.tasks  # the API's task service (set where the app is made)
        apps = AppService(control, request.app.state.route_hub)
        try:
            body = CloneIn(parameters=params)
            made = await asyncio.to_thread(clone_task, tasks, apps, who.caller, task_id, body)
        except ValidationError as exc:
            error = "; ".join(str(e["msg"]) for e in exc.errors())
            return web.page(request, who, "clone.html", 422, task=out, error=error)
        except KliqueError as exc:
            return web.page(request, who, "clone.html", status_of(exc), task=out, error=str(exc))
        return RedirectResponse(f"/tasks/{made.id}", status_code=303, headers=HEADERS)


def edited_parameters(original: dict[str, Any], form: Any) -> dict[str, Any]:
    """The form's `param.NAME` fields, typed like the original values: text stays text, other
    values are read as JSON (so 0.01 stays a number); a value that does not parse is text."""
    params = dict(original)
    for key, value in form.multi_items():
        if not key.startswith("param.") or not isinstance(value, str):
            continue
        name = key.removeprefix("param.")
        if isinstance(original.get(name), str):
            params[name] = value
            continue
        try:
            params[name] = json.loads(value)
        except ValueError:
            params[name] = value
    return params
