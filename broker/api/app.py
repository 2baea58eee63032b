"""The REST API (OpenAPI at /docs and /openapi.json). Thin: validation, auth, the store."""

import asyncio
import time
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from broker import authz
from broker.api import artifacts, sdk, sweeps
from broker.api.agents import agent_router
from broker.api.auth import Auth, Caller, bearer, owned_task, reporting_task
from broker.api.create import queue_task, spec_of
from broker.api.creations import Creations
from broker.api.identity import identity_router
from broker.api.limits import BodyLimit
from broker.api.schemas import (
    ArtifactOut,
    LogChunk,
    PoolOut,
    Report,
    ResourceOut,
    SimulateRequest,
    SimulationOut,
    SubmitRequest,
    TaskOut,
    UsageLineOut,
    UsageOut,
    WhyOut,
)
from broker.artifacts import ArtifactStore
from broker.authz import Action, report_refusal
from broker.bounds import report_problem
from broker.domain import Task, TaskState
from broker.errors import KliqueError, NotFound, NotPermitted
from broker.estate import parse_estate
from broker.identity.resolve import Identities
from broker.scheduler.fairshare import UsageRow, decayed_usage
from broker.scheduler.loop import HOLDING, Scheduler, _active
from broker.simulate import Trace, queued_of, simulate
from broker.usage import Run, UsageKey, summarise
from inside_job.reporter import decode_prefix

API = "/api/v1"


class ErrorOut(BaseModel):
    detail: Any  # one sentence (what, and how to fix it), or FastAPI's list of field errors


# Every operation may answer these, always as {"detail": ...}.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorOut, "description": what}
    for status, what in (
        (400, "a malformed request: the detail says what and how to fix it"),
        (401, "a missing, unknown or wrong token"),
        (403, "not permitted: policy, ownership, admin-only"),
        (404, "no such task, compute resource or pool (or not yours)"),
        (413, "over the server's size limits (limits: in the estate)"),
        (422, "a field does not match its schema"),
    )
}
TaskId = Annotated[int, PathParam(ge=1, lt=2**63, description="A task's id.")]
_LOG_CHUNK = 1 << 20


def create_app(scheduler: Scheduler, lifespan: Any = None) -> FastAPI:
    app = FastAPI(
        title="Klique",
        version="0.1.0",
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
        description="Submit tasks to compute resources; follow, explain and cancel them.",
    )
    app.state.scheduler = scheduler
    settings = scheduler.estate.artifacts
    app.state.artifacts = ArtifactStore(settings.store, scheduler.home, settings.max_bytes)
    app.add_middleware(
        BodyLimit,
        limit=lambda: scheduler.estate.limits.max_request_bytes,
        skip=artifacts.streams_itself,
    )
    app.include_router(sdk.router)
    app.include_router(artifacts.router)
    app.include_router(sweeps.router)

    @app.exception_handler(KliqueError)
    async def _klique_error(_request: Request, exc: KliqueError) -> JSONResponse:
        status = 404 if isinstance(exc, NotFound) else 403 if isinstance(exc, NotPermitted) else 400
        return JSONResponse({"detail": str(exc)}, status_code=status)

    identities = Identities(scheduler.store, lambda: scheduler.estate)
    app.state.identities = identities  # broker/api/auth.py finds callers through it
    app.include_router(identity_router(identities, API))

    def admin(who: Auth) -> Caller:
        authz.check_admin(who, "do this")
        return who

    app.include_router(agent_router(scheduler, admin))

    def own_task(task_id: int, who: Caller, action: Action = Action.READ_TASK) -> Task:
        return owned_task(scheduler.store, task_id, who, action)

    @app.get(f"{API}/health")
    def health() -> dict[str, Any]:
        """Up; placement cycles run, and each pool agent's looks at its pool."""
        looks = {name: agent.looks for name, agent in scheduler.agents.items()}
        return {"ok": True, "cycles": scheduler.cycles, "looks": looks}

    @app.get(f"{API}/whoami")
    def whoami(who: Auth) -> dict[str, Any]:
        return {
            "user": who.user,
            "admin": who.admin,
            "team": who.team,
            "kind": who.kind,
            "scopes": sorted(who.scopes),
            "via": who.via,
        }

    creations = Creations(scheduler.store)

    @app.post(f"{API}/tasks", status_code=201)
    async def submit(body: SubmitRequest, who: Auth) -> TaskOut:
        spec = spec_of(body, scheduler.estate.default_resource or "")
        return _task_out(await queue_task(scheduler, creations, who, spec), scheduler)

    @app.get(f"{API}/tasks")
    def list_tasks(
        who: Auth,
        state: Annotated[str | None, Query(max_length=200)] = None,
        all_users: bool = False,
        limit: Annotated[int, Query(ge=1, le=1000)] = 200,
        before: Annotated[int | None, Query(ge=1, lt=2**63)] = None,
        project: Annotated[str | None, Query(max_length=200)] = None,
    ) -> list[TaskOut]:
        """The newest tasks first, a page at a time: pass the last id seen as `before`."""
        owner = authz.owner_filter(who, None if all_users else who.user)
        tasks = scheduler.store.tasks(
            owner=owner,
            states=_states(state),
            limit=limit,
            newest_first=True,
            before=before,
            with_diff=False,
            project=project,
        )
        return [_task_out(t, scheduler) for t in tasks]

    @app.get(f"{API}/tasks/{{task_id}}")
    def show(task_id: TaskId, who: Auth) -> TaskOut:
        return _task_out(own_task(task_id, who), scheduler, detail=True)

    @app.get(f"{API}/tasks/{{task_id}}/why")
    def why(task_id: TaskId, who: Auth) -> WhyOut:
        return why_out(scheduler, own_task(task_id, who))

    @app.get(f"{API}/tasks/{{task_id}}/logs")
    async def logs(
        task_id: TaskId,
        who: Auth,
        offset: Annotated[int, Query(ge=0, lt=2**62)] = 0,
        rank: Annotated[int, Query(ge=0, le=4095)] = 0,
    ) -> LogChunk:
        task = await asyncio.to_thread(own_task, task_id, who)
        data = await _read_console(task, scheduler, offset, _rank(task, scheduler, rank))
        # A character split at the chunk's end waits for the next read, unless this is the end.
        text, used = decode_prefix(data, task.state.final and len(data) < _LOG_CHUNK)
        return LogChunk(id=task.id, offset=offset + used, text=text, final=task.state.final)

    @app.post(f"{API}/tasks/{{task_id}}/cancel")
    async def cancel(task_id: TaskId, who: Auth) -> TaskOut:
        task = await asyncio.to_thread(own_task, task_id, who, Action.CANCEL)
        if not task.state.final:
            task = await scheduler.cancel(task)
            await sdk.cancel_steps(scheduler, task.id)
        return await asyncio.to_thread(_task_out, task, scheduler)

    @app.post(f"{API}/tasks/{{task_id}}/report")
    def report(
        task_id: TaskId, body: Report, authorization: Annotated[str | None, Header()] = None
    ) -> dict[str, bool]:
        """What a task's runner says: state, console, scalars, its end. The end is a claim: the
        task becomes final only when its pool sees the job gone (see SECURITY.md)."""
        store = scheduler.store
        task = reporting_task(store, task_id, bearer(authorization))
        if task is None:  # a wrong token, or a superseded attempt's: the attempt is over
            raise HTTPException(401, "not a valid report token for this task")
        refusal = report_refusal(task)
        if refusal:
            raise HTTPException(409, refusal)
        _check_report_bounds(task, body, scheduler)
        if body.console is not None:
            _save_console(task, scheduler, body.console.offset, body.console.text)
        if body.scalars:
            store.add_scalars(task.id, [s.model_dump() for s in body.scalars])
        # One write at most: the start and the claimed end together, where both are news.
        claim: dict[str, Any] = {}
        if body.exit is not None and not task.state.final:
            claim["claim"] = body.exit.model_dump()
        starting = (TaskState.SUBMITTED, TaskState.PENDING)
        started = body.state is not None and body.state.state in ("running", "done")
        moved = None
        if started and task.state in starting:
            moved = store.change_state(task.id, TaskState.RUNNING, only_from=starting, **claim)
        if claim and moved is None:  # already running (or moved on meanwhile)
            store.update(task.id, **claim)
        if claim:
            scheduler.wake_pool(task.pool)  # the pool confirms at its next look
        return {"ok": True}

    @app.get(f"{API}/resources")
    def resources(who: Auth) -> list[ResourceOut]:
        estate = scheduler.estate
        team = who.team
        return [
            ResourceOut.of(r, permitted=estate.permitted(team, r.name))
            for r in estate.resources.values()
        ]

    @app.get(f"{API}/pools")
    def pools(who: Auth) -> list[PoolOut]:
        return [
            PoolOut.of(p, scheduler.snapshots().get(p.name), scheduler.strangers(p.name))
            for p in scheduler.estate.pools.values()
        ]

    @app.get(f"{API}/usage")
    def usage(who: Auth, by: UsageKey = "team", since: float | None = None) -> UsageOut:
        """GPU-seconds and wall seconds from the ledger; admins see everyone, users themselves."""
        return usage_out(scheduler, who, by, since)

    @app.post(f"{API}/policy/simulate")
    def policy_simulate(body: SimulateRequest, who: Auth) -> SimulationOut:
        """One placement cycle of the current queue under a changed estate; changes nothing."""
        return simulation_out(scheduler, body, who)

    from broker.api.apps import router as apps_router
    from broker.routes import mount_routes

    app.include_router(apps_router, prefix=API)
    mount_routes(app)

    from broker.web.errors import install_error_pages
    from broker.web.ui import Web, web_router  # the web UI uses this module's helpers below

    app.include_router(web_router(scheduler))
    install_error_pages(app, Web(scheduler))
    return app


def why_out(scheduler: Scheduler, task: Task) -> WhyOut:
    reason = scheduler.why(task)
    if reason is None:
        return WhyOut(
            id=task.id,
            state=task.state,
            waiting=False,
            primary="",
            sentence="",
            detail=task.reason or f"the task is {task.state.value}",
            pools={},
            reason=task.reason,
        )
    return WhyOut(
        id=task.id,
        state=task.state,
        waiting=True,
        primary=reason.primary.value,
        sentence=reason.primary.sentence,
        detail=reason.detail,
        pools=dict(reason.pools),
        reason=reason.text,
    )


def usage_out(scheduler: Scheduler, who: Caller, by: UsageKey, since: float | None) -> UsageOut:
    """GPU-seconds and wall seconds from the ledger; admins see everyone, users themselves."""
    until = time.time()
    runs = [
        Run(r.owner, r.team, r.project, r.resource, r.pool, r.gpus, r.start, r.end)
        for r in scheduler.store.ledger(since=since)
        if authz.sees_owner(who, r.owner)
    ]
    return UsageOut(
        by=by,
        since=since,
        until=until,
        everyone=who.admin,
        rows=[
            UsageLineOut(
                key=line.key,
                runs=line.runs,
                gpu_seconds=line.gpu_seconds,
                gpu_hours=line.gpu_hours,
                wall_seconds=line.wall_seconds,
                ongoing=line.ongoing,
            )
            for line in summarise(runs, by, until, since)
        ],
    )


def simulation_out(scheduler: Scheduler, body: SimulateRequest, who: Caller) -> SimulationOut:
    """One placement cycle of the current queue under a changed estate; changes nothing."""
    authz.check_admin(who, "simulate a changed estate")
    estate = parse_estate(body.estate, body.source)
    now = time.time()
    store = scheduler.store
    queued = [queued_of(t) for t in store.tasks(states=[TaskState.QUEUED])]
    active = [_active(t, now) for t in store.tasks(states=HOLDING)]
    half_life = estate.fair_share_half_life_s
    ledger = store.ledger(since=now - 10 * half_life)
    shares = decayed_usage(
        [UsageRow(r.team or "", r.start, r.end, r.gpus) for r in ledger], now, half_life
    )
    states = scheduler.snapshots()
    result = simulate(estate, queued, active, states, shares, now)
    out = SimulationOut.model_validate(result.to_dict())
    if body.include_trace:
        out.trace = Trace(queued, active, states, shares, now).to_dict()
    return out


def _task_out(task: Task, scheduler: Scheduler, detail: bool = False) -> TaskOut:
    out = TaskOut.of(task)
    waiting = scheduler.pending.get(task.id)
    if waiting is not None and task.state is TaskState.QUEUED:
        out.reason = waiting.text
    if detail:
        out.events = scheduler.store.events(task.id)
        out.scalars = scheduler.store.scalars(task.id)
        out.packages = list(task.packages)
        out.artifacts = [ArtifactOut(**a) for a in scheduler.store.artifacts(task.id)]
    return out


def _states(text: str | None) -> list[TaskState] | None:
    if not text:
        return None
    known = {s.value for s in TaskState}
    unknown = [s for s in text.split(",") if s not in known]
    if unknown:
        raise HTTPException(
            400, f"unknown states {', '.join(unknown)}; use any of {', '.join(sorted(known))}"
        )
    return [TaskState(s) for s in text.split(",")]


def _console_copy(task: Task, scheduler: Scheduler) -> Path:
    """The console as the runner reported it over HTTP, kept in the server's own home."""
    return scheduler.home / "console" / f"{task.id}.log"


def _rank(task: Task, scheduler: Scheduler, rank: int) -> int:
    """A rank of a task on several nodes whose console is asked for: one it has."""
    resource = scheduler.estate.resources.get(task.resource)
    nodes = resource.profile.nodes if resource is not None else 1
    if rank >= nodes:
        raise HTTPException(
            400, f"task {task.id} runs on {nodes} node(s): ranks 0 to {nodes - 1} have consoles"
        )
    return rank


async def _read_console(task: Task, scheduler: Scheduler, offset: int, rank: int = 0) -> bytes:
    """From the job folder, read as the task's own account by its pool; else the reported copy
    (rank 0's: the other ranks of a task on several nodes are read from the job folder only).
    The server never opens a file in a folder a user can write."""
    driver = scheduler.drivers.get(task.pool or "")
    if driver is not None and task.job_dir:
        try:
            data = await driver.read_console(task, offset, _LOG_CHUNK, rank)
        except KliqueError:
            data = None
        if data is not None:
            return data
    if rank:
        return b""
    try:
        with _console_copy(task, scheduler).open("rb") as f:
            f.seek(offset)
            return f.read(_LOG_CHUNK)
    except OSError:
        return b""


def _check_report_bounds(task: Task, body: Report, scheduler: Scheduler) -> None:
    """413, naming the estate's limit, for a report that would pass one of the task's bounds."""
    console = body.console
    console_end = None if console is None else console.offset + len(console.text.encode())
    adding = len(body.scalars or [])
    kept = scheduler.store.scalar_count(task.id) if adding else 0
    problem = report_problem(scheduler.estate.limits, task.id, console_end, kept, adding)
    if problem:
        raise HTTPException(413, problem)


def _save_console(task: Task, scheduler: Scheduler, offset: int, text: str) -> None:
    path = _console_copy(task, scheduler)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode()
    with path.open("ab") as f:
        size = f.tell()
        if offset <= size < offset + len(data):  # resends of what is there already are skipped
            f.write(data[size - offset :])
