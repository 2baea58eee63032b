"""The estate's pages: compute resources and pools (live), usage (charts, table, CSV), policies
with the policy simulator, the batch template preview, and apps when the API has them."""

from __future__ import annotations

import asyncio
import csv
import io
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.datastructures import UploadFile

from broker import authz
from broker.control.loop import Scheduler
from broker.domain import TaskState
from broker.errors import EstateError, KliqueError, NotPermitted
from broker.execution import HOLDING
from broker.preview import render_preview, sample_task
from broker.store import web as web_store
from broker.tasks.overview import simulation_out, usage_out
from broker.tasks.schemas import PoolOut, ResourceOut, SimulateRequest
from broker.usage import USAGE_KEYS, UsageKey, parse_since
from broker.web import forms
from broker.web.features import APP_LAUNCH, APP_STOP, APPS, APPS_RUNNING
from broker.web.render import HEADERS
from broker.web.ui import Viewer, Web

PERIODS = [("24h", "last 24 hours"), ("7d", "last 7 days"), ("30d", "last 30 days")]
MAX_ESTATE = 4 << 20  # an uploaded estate file for the simulator


@dataclass(frozen=True)
class PoolView:
    out: PoolOut  # its last_good: when the pool last answered well
    slots: int | None  # host pools: slots and GPUs from the estate
    gpus: int | None
    running: int
    waiting: int  # Klique's tasks placed or in the pool's own queue
    gpus_used: float


def pool_views(scheduler: Scheduler) -> list[PoolView]:
    running = {
        k[0]: (n, g) for k, n, g in web_store.tally(scheduler.store, [TaskState.RUNNING], "pool")
    }
    waiting = {
        k[0]: n
        for k, n, _ in web_store.tally(
            scheduler.store, [TaskState.PLACED, TaskState.SUBMITTED, TaskState.PENDING], "pool"
        )
    }
    views = []
    states = scheduler.snapshots()
    for pool in scheduler.estate.pools.values():
        host = not pool.queueing
        views.append(
            PoolView(
                PoolOut.of(pool, states.get(pool.name), scheduler.strangers(pool.name)),
                pool.slots if host else None,
                pool.gpus if host else None,
                running.get(pool.name, (0, 0.0))[0],
                waiting.get(pool.name, 0),
                running.get(pool.name, (0, 0.0))[1],
            )
        )
    return views


def resources_context(scheduler: Scheduler, who: Viewer) -> dict[str, Any]:
    estate = scheduler.estate
    team = estate.team_of(who.user)
    queued = {
        k[0]: n for k, n, _ in web_store.tally(scheduler.store, [TaskState.QUEUED], "resource")
    }
    return {
        "resources": [
            ResourceOut.of(r, permitted=estate.permitted(team, r.name))
            for r in estate.resources.values()
        ],
        "queued": queued,
        "pools": pool_views(scheduler),
    }


def usage_bars(rows: list[Any], width: int = 600) -> list[tuple[str, float, int]]:
    """(key, GPU-hours, bar width in px) for an SVG bar chart, the longest bar `width`."""
    top = max((r.gpu_hours for r in rows), default=0.0)
    return [(r.key, r.gpu_hours, int(width * r.gpu_hours / top) if top else 0) for r in rows]


def _usage_query(request: Request) -> tuple[UsageKey, str, float | None, str]:
    by = request.query_params.get("by", "team")
    if by not in USAGE_KEYS:
        by = "team"
    since_text = request.query_params.get("since", "7d").strip()[:100]
    error = ""
    since = None
    if since_text:
        try:
            since = parse_since(since_text, time.time())
        except ValueError as exc:
            error = str(exc)
    return by, since_text, since, error  # type: ignore[return-value]


def policy_rows(scheduler: Scheduler) -> list[dict[str, Any]]:
    estate = scheduler.estate
    use: dict[tuple[str, str], int] = {}
    for (team, resource), n, _ in web_store.tally(scheduler.store, HOLDING, "team", "resource"):
        use[(team or "", resource)] = n
    rows = []
    for policy in estate.policies.values():
        rows.append(
            {
                "team": policy.team,
                "users": list(estate.teams[policy.team].users)
                if policy.team in estate.teams
                else [],
                "priority": policy.priority,
                "resources": [
                    {
                        "name": r,
                        "reservation": policy.reservation.get(r),
                        "limit": policy.limit.get(r),
                        "use": use.get((policy.team, r), 0),
                    }
                    for r in policy.resources
                ],
            }
        )
    return rows


async def _estate_text(form: Any) -> tuple[str, str]:
    upload = form.get("estate_file")
    if isinstance(upload, UploadFile) and upload.filename:
        data = await upload.read(MAX_ESTATE + 1)
        if len(data) > MAX_ESTATE:
            raise KliqueError(f"the estate file is over {MAX_ESTATE} bytes")
        return data.decode("utf-8", errors="replace"), upload.filename[:200]
    return str(form.get("estate_text") or ""), "<pasted estate>"


async def _api_list(web: Web, request: Request, who: Viewer, path: str) -> list[Any]:
    answer = await web.call_api(request, who, "GET", path)
    found = answer.json() if answer.status_code == 200 else []
    return found if isinstance(found, list) else []


def add_routes(router: APIRouter, web: Web) -> None:
    scheduler = web.scheduler

    @router.get("/pools")
    def pools(request: Request) -> HTMLResponse:
        who = web.viewer(request)
        return web.page(request, who, "pools.html", **resources_context(scheduler, who))

    @router.get("/usage")
    def usage(request: Request) -> HTMLResponse:
        who = web.viewer(request)
        by, since_text, since, error = _usage_query(request)
        out = usage_out(scheduler.store, who.caller, by, since)
        return web.page(
            request,
            who,
            "usage.html",
            usage=out,
            by=by,
            keys=USAGE_KEYS,
            since_text=since_text,
            periods=PERIODS,
            error=error,
            bars=usage_bars(out.rows),
        )

    @router.get("/usage.csv")
    def usage_csv(request: Request) -> Response:
        who = web.viewer(request)
        by, _, since, _ = _usage_query(request)
        out = usage_out(scheduler.store, who.caller, by, since)
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow([by, "runs", "ongoing", "gpu_hours", "gpu_seconds", "wall_seconds"])
        for row in out.rows:
            # A key starting with = + - @ would be a formula in a spreadsheet: quote it as text.
            key = "'" + row.key if row.key[:1] in ("=", "+", "-", "@") else row.key
            writer.writerow(
                [
                    key,
                    row.runs,
                    row.ongoing,
                    f"{row.gpu_hours:.6f}",
                    row.gpu_seconds,
                    row.wall_seconds,
                ]
            )
        headers = {**HEADERS, "Content-Disposition": f'attachment; filename="usage-by-{by}.csv"'}
        return Response(buffer.getvalue(), media_type="text/csv", headers=headers)

    @router.get("/policies")
    def policies(request: Request) -> HTMLResponse:
        who = web.viewer(request)
        return web.page(
            request, who, "policies.html", policies=policy_rows(scheduler), result=None, error=""
        )

    @router.post("/policies/simulate")
    async def simulate(request: Request) -> HTMLResponse:
        who, form = await web.posted(request)
        result, error = None, ""
        try:
            text, source = await _estate_text(form)
            body = SimulateRequest(estate=text or " ", source=source, include_trace=False)
            result = simulation_out(scheduler.store, scheduler.snapshots(), body, who.caller)
        except EstateError as exc:
            error = "\n".join(exc.problems)
        except KliqueError as exc:
            error = str(exc)
        now = {
            t: scheduler.pending.get(t) for t in ([v.id for v in result.tasks] if result else [])
        }
        return web.page(
            request,
            who,
            "policies.html",
            200 if result else 400,
            policies=policy_rows(scheduler),
            result=result,
            waiting_now=now,
            error=error,
        )

    @router.get("/platform")
    async def platform(request: Request) -> HTMLResponse:
        who = web.viewer(request)
        try:
            authz.check(who, authz.Action.ADMINISTER)
        except NotPermitted:
            return web.error(
                request, who, 403, "the template preview is for the platform team (an admin)"
            )
        estate = scheduler.estate
        resource = request.query_params.get("resource") or ""
        pool = request.query_params.get("pool") or None
        check = request.query_params.get("check") == "1"
        preview, error = None, ""
        if resource:
            try:
                task = sample_task(estate, resource)
                preview = await asyncio.to_thread(render_preview, estate, task, pool, check)
            except KliqueError as exc:
                error = str(exc)
        return web.page(
            request,
            who,
            "platform.html",
            resources=list(estate.resources),
            pools=[p.name for p in estate.pools.values() if p.queueing],
            resource=resource,
            pool=pool or "",
            check=check,
            preview=preview,
            error=error,
        )

    @router.get("/apps")
    async def apps(request: Request) -> HTMLResponse:
        who = web.viewer(request)
        if not web.features(request).apps:
            return web.error(request, who, 404, "this server has no apps yet")
        catalogue = await _api_list(web, request, who, APPS)
        running = await _api_list(web, request, who, APPS_RUNNING)
        entries = [
            {**entry, "fields": forms.fields(entry.get("form") or {})}
            for entry in catalogue
            if isinstance(entry, dict) and "name" in entry
        ]
        return web.page(
            request,
            who,
            "apps.html",
            catalogue=entries,
            running=running,
            error=request.query_params.get("error", ""),
        )

    @router.post("/apps/{name}/launch")
    async def app_launch(request: Request, name: str) -> Response:
        who, form = await web.posted(request)
        catalogue = await _api_list(web, request, who, APPS)
        entry = next((e for e in catalogue if isinstance(e, dict) and e.get("name") == name), None)
        if entry is None:
            return web.error(request, who, 404, f"no app {name!r} in the catalogue")
        body: dict[str, Any] = {"params": forms.values(entry.get("form") or {}, form)}
        if form.get("resource"):
            body["resource"] = str(form.get("resource"))
        answer = await web.call_api(
            request, who, "POST", APP_LAUNCH.format(name=quote(name, safe="")), body
        )
        return _after_app_call(answer)

    @router.post("/apps/instances/{task_id}/stop")
    async def app_stop(request: Request, task_id: str) -> Response:
        who, _ = await web.posted(request)
        answer = await web.call_api(
            request, who, "POST", APP_STOP.format(task_id=quote(task_id, safe="")), {}
        )
        return _after_app_call(answer)


def _after_app_call(answer: Any) -> Response:
    """Back to the apps page; a refusal's sentence is shown there as the API says it."""
    if answer.status_code >= 400:
        detail = answer.json().get("detail", answer.text)
        return RedirectResponse(f"/apps?error={quote(str(detail)[:2000])}", 303, headers=HEADERS)
    return RedirectResponse("/apps", 303, headers=HEADERS)
