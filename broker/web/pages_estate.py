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
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from broker import authz
from broker.control.loop import ControlLoop
from broker.domain import TaskState
from broker.errors import EstateError, KliqueError, NotFound, NotPermitted
from broker.execution import HOLDING
from broker.preview import render_preview, sample_task
from broker.store import web as web_store
from broker.tasks.app_schemas import LaunchRequest
from broker.tasks.apps import AppService
from broker.tasks.overview import simulation_out, usage_out
from broker.tasks.schemas import PoolOut, ResourceOut, SimulateRequest
from broker.usage import USAGE_KEYS, UsageKey, parse_since
from broker.web import forms
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


def pool_views(control: ControlLoop) -> list[PoolView]:
    running = {
        k[0]: (n, g) for k, n, g in web_store.tally(control.store, [TaskState.RUNNING], "pool")
    }
    waiting = {
        k[0]: n
        for k, n, _ in web_store.tally(
            control.store, [TaskState.PLACED, TaskState.SUBMITTED, TaskState.PENDING], "pool"
        )
    }
    views = []
    states = control.snapshots()
    for pool in control.estate.pools.values():
        host = not pool.queueing
        views.append(
            PoolView(
                PoolOut.of(pool, states.get(pool.name), control.strangers(pool.name)),
                pool.slots if host else None,
                pool.gpus if host else None,
                running.get(pool.name, (0, 0.0))[0],
                waiting.get(pool.name, 0),
                running.get(pool.name, (0, 0.0))[1],
            )
        )
    return views


def resources_context(control: ControlLoop, who: Viewer) -> dict[str, Any]:
    estate = control.estate
    team = estate.team_of(who.user)
    queued = {k[0]: n for k, n, _ in web_store.tally(control.store, [TaskState.QUEUED], "resource")}
    return {
        "resources": [
            ResourceOut.of(r, permitted=estate.permitted(team, r.name))
            for r in estate.resources.values()
        ],
        "queued": queued,
        "pools": pool_views(control),
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


def policy_rows(control: ControlLoop) -> list[dict[str, Any]]:
    estate = control.estate
    use: dict[tuple[str, str], int] = {}
    for (team, resource), n, _ in web_store.tally(control.store, HOLDING, "team", "resource"):
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


def add_routes(router: APIRouter, web: Web) -> None:
    control = web.control

    @router.get("/pools")
    def pools(request: Request) -> HTMLResponse:
        who = web.viewer(request)
        return web.page(request, who, "pools.html", **resources_context(control, who))

    @router.get("/usage")
    def usage(request: Request) -> HTMLResponse:
        who = web.viewer(request)
        by, since_text, since, error = _usage_query(request)
        out = usage_out(control.store, who.caller, by, since)
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
        out = usage_out(control.store, who.caller, by, since)
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
            request, who, "policies.html", policies=policy_rows(control), result=None, error=""
        )

    @router.post("/policies/simulate")
    async def simulate(request: Request) -> HTMLResponse:
        who, form = await web.posted(request)
        result, error = None, ""
        try:
            text, source = await _estate_text(form)
            body = SimulateRequest(estate=text or " ", source=source, include_trace=False)
            result = simulation_out(control.store, control.snapshots(), body, who.caller)
        except EstateError as exc:
            error = "\n".join(exc.problems)
        except KliqueError as exc:
            error = str(exc)
        now = {t: control.pending.get(t) for t in ([v.id for v in result.tasks] if result else [])}
        return web.page(
            request,
            who,
            "policies.html",
            200 if result else 400,
            policies=policy_rows(control),
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
        estate = control.estate
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

    def apps_of(request: Request) -> AppService:
        return AppService(control, request.app.state.route_hub)

    @router.get("/apps")
    def apps(request: Request) -> HTMLResponse:
        who = web.viewer(request)
        if not web.features(request).apps:
            return web.error(request, who, 404, "this server has no apps yet")
        service = apps_of(request)
        entries = [
            {**app.model_dump(mode="json"), "fields": forms.fields(app.form)}
            for app in service.apps(who.caller)
        ]
        running = [i.model_dump(mode="json") for i in service.instances(who.caller)]
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
        service = apps_of(request)
        try:
            app = await asyncio.to_thread(service.app, who.caller, name)
        except NotFound:
            return web.error(request, who, 404, f"no app {name!r} in the catalogue")
        try:
            body = LaunchRequest(
                params=forms.values(app.form, form),
                resource=str(form.get("resource") or "") or None,
            )
            await asyncio.to_thread(service.launch, who.caller, name, body)
        except ValidationError as exc:
            return _back_to_apps("; ".join(str(e["msg"]) for e in exc.errors()))
        except KliqueError as exc:
            return _back_to_apps(str(exc))
        return _back_to_apps()

    @router.post("/apps/instances/{task_id}/stop")
    async def app_stop(request: Request, task_id: str) -> Response:
        who, _ = await web.posted(request)
        if not (task_id.isdigit() and 0 < int(task_id) < 2**63):
            return _back_to_apps(f"no app {task_id[:40]!r} of yours; `klique app ls` lists them")
        try:
            await apps_of(request).stop(who.caller, int(task_id))
        except KliqueError as exc:
            return _back_to_apps(str(exc))
        return _back_to_apps()


def _back_to_apps(error: str = "") -> Response:
    """Back to the apps page; a refusal's sentence is shown there as the API says it."""
    if error:
        return RedirectResponse(f"/apps?error={quote(error[:2000])}", 303, headers=HEADERS)
    return RedirectResponse("/apps", 303, headers=HEADERS)
