"""The REST API (OpenAPI at /docs and /openapi.json). Thin: validation, auth, the store."""

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse

from broker.api.schemas import (
    LogChunk,
    PoolOut,
    Report,
    ResourceOut,
    SimulateRequest,
    SimulationOut,
    SubmitRequest,
    TaskOut,
    TokenRequest,
    UsageLineOut,
    UsageOut,
    WhyOut,
)
from broker.domain import CodeSpec, Task, TaskSpec, TaskState
from broker.errors import KliqueError, NotFound, NotPermitted
from broker.estate import parse_estate
from broker.pools.base import RUNNER_OUTCOMES, observation_from_exit
from broker.scheduler.fairshare import UsageRow, decayed_usage
from broker.scheduler.loop import HOLDING, Scheduler, _active
from broker.simulate import Trace, queued_of, simulate
from broker.usage import Run, UsageKey, summarise

API = "/api/v1"


@dataclass(frozen=True)
class Caller:
    user: str
    admin: bool


def create_app(scheduler: Scheduler, lifespan: Any = None) -> FastAPI:
    app = FastAPI(
        title="Klique",
        version="0.1.0",
        lifespan=lifespan,
        description="Submit tasks to compute resources; follow, explain and cancel them.",
    )
    app.state.scheduler = scheduler

    @app.exception_handler(KliqueError)
    async def _klique_error(_request: Request, exc: KliqueError) -> JSONResponse:
        status = 404 if isinstance(exc, NotFound) else 403 if isinstance(exc, NotPermitted) else 400
        return JSONResponse({"detail": str(exc)}, status_code=status)

    def caller(authorization: Annotated[str | None, Header()] = None) -> Caller:
        token = (authorization or "").removeprefix("Bearer ").strip()
        found = scheduler.store.user_for_token(token) if token else None
        if found is None:
            raise HTTPException(
                401,
                "missing or unknown token; run `klique login --token TOKEN` "
                "(the server prints where its admin token is)",
            )
        return Caller(*found)

    Auth = Annotated[Caller, Depends(caller)]

    def own_task(task_id: int, who: Caller) -> Task:
        task = scheduler.store.get(task_id)
        if task.owner != who.user and not who.admin:
            raise NotFound(f"no task {task_id} of yours; `klique ls` lists your tasks")
        return task

    @app.get(f"{API}/health")
    def health() -> dict[str, Any]:
        return {"ok": True, "cycles": scheduler.cycles}

    @app.get(f"{API}/whoami")
    def whoami(who: Auth) -> dict[str, Any]:
        return {"user": who.user, "admin": who.admin, "team": scheduler.estate.team_of(who.user)}

    @app.post(f"{API}/tokens", status_code=201)
    def create_token(body: TokenRequest, who: Auth) -> dict[str, str]:
        if not who.admin:
            raise NotPermitted("only an admin token can make tokens")
        return {"user": body.user, "token": scheduler.store.add_token(body.user, admin=body.admin)}

    @app.post(f"{API}/tasks", status_code=201)
    def submit(body: SubmitRequest, who: Auth) -> TaskOut:
        estate = scheduler.estate
        resource = body.resource or estate.default_resource or ""
        if resource not in estate.resources:
            known = ", ".join(estate.resources)
            raise NotFound(
                f"unknown compute resource {resource!r}; known: {known} "
                "(`klique resources` lists them)"
            )
        team = estate.team_of(who.user)
        if not estate.permitted(team, resource):
            raise NotPermitted(
                f"team {team or '(none)'} may not use compute resource {resource!r}; "
                "ask the platform team to add it to your team's policy"
            )
        spec = TaskSpec(
            command=tuple(body.command),
            resource=resource,
            name=body.name,
            project=body.project,
            env=dict(body.env),
            requirements=tuple(body.requirements),
            requirements_file=body.requirements_file,
            image=body.image,
            code=CodeSpec(**body.code.model_dump()) if body.code else None,
        )
        profile = estate.resources[resource].profile
        task = scheduler.store.create_task(spec, who.user, team, gpus=profile.gpu_share)
        scheduler.wake()
        return _task_out(task, scheduler)

    @app.get(f"{API}/tasks")
    def list_tasks(
        who: Auth, state: str | None = None, all_users: bool = False, limit: int = 200
    ) -> list[TaskOut]:
        owner = None if (all_users and who.admin) else who.user
        states = [TaskState(s) for s in state.split(",")] if state else None
        tasks = scheduler.store.tasks(owner=owner, states=states, limit=limit, newest_first=True)
        return [_task_out(t, scheduler) for t in tasks]

    @app.get(f"{API}/tasks/{{task_id}}")
    def show(task_id: int, who: Auth) -> TaskOut:
        return _task_out(own_task(task_id, who), scheduler, detail=True)

    @app.get(f"{API}/tasks/{{task_id}}/why")
    def why(task_id: int, who: Auth) -> WhyOut:
        task = own_task(task_id, who)
        reason = scheduler.pending.get(task.id)
        if reason is None:
            return WhyOut(
                id=task.id,
                state=task.state,
                waiting=False,
                primary="",
                sentence="",
                detail=task.reason or f"the task is {task.state.value}",
                pools={},
            )
        return WhyOut(
            id=task.id,
            state=task.state,
            waiting=True,
            primary=reason.primary.value,
            sentence=reason.primary.sentence,
            detail=reason.detail,
            pools=dict(reason.pools),
        )

    @app.get(f"{API}/tasks/{{task_id}}/logs")
    def logs(task_id: int, who: Auth, offset: int = 0) -> LogChunk:
        task = own_task(task_id, who)
        text, end = _read_console(task, scheduler, offset)
        return LogChunk(id=task.id, offset=end, text=text, final=task.state.final)

    @app.post(f"{API}/tasks/{{task_id}}/cancel")
    async def cancel(task_id: int, who: Auth) -> TaskOut:
        task = own_task(task_id, who)
        if task.state.final:
            return _task_out(task, scheduler)
        return _task_out(await scheduler.cancel(task), scheduler)

    @app.post(f"{API}/tasks/{{task_id}}/report")
    def report(
        task_id: int, body: Report, authorization: Annotated[str | None, Header()] = None
    ) -> dict[str, bool]:
        task = scheduler.store.get(task_id)
        if (authorization or "").removeprefix("Bearer ").strip() != task.report_token:
            raise HTTPException(401, "not this task's report token")
        if body.console is not None:
            _save_console(task, scheduler, body.console.offset, body.console.text)
        if body.scalars:
            scheduler.store.add_scalars(task.id, [s.model_dump() for s in body.scalars])
        if body.state is not None and body.state.state in ("running", "done"):
            scheduler.store.change_state(
                task.id, TaskState.RUNNING, only_from=[TaskState.SUBMITTED, TaskState.PENDING]
            )
        if body.exit is not None and body.exit.get("outcome") in RUNNER_OUTCOMES:
            seen = observation_from_exit(body.exit)
            scheduler.store.change_state(
                task.id,
                seen.state,
                seen.reason,
                only_from=[TaskState.RUNNING],
                exit_code=seen.exit_code,
            )
        return {"ok": True}

    @app.get(f"{API}/resources")
    def resources(who: Auth) -> list[ResourceOut]:
        estate = scheduler.estate
        team = estate.team_of(who.user)
        return [
            ResourceOut.of(r, permitted=estate.permitted(team, r.name))
            for r in estate.resources.values()
        ]

    @app.get(f"{API}/pools")
    def pools(who: Auth) -> list[PoolOut]:
        return [
            PoolOut.of(p, scheduler.pool_states.get(p.name), scheduler.drivers[p.name].strangers)
            for p in scheduler.estate.pools.values()
        ]

    @app.get(f"{API}/usage")
    def usage(who: Auth, by: UsageKey = "team", since: float | None = None) -> UsageOut:
        """GPU-seconds and wall seconds from the ledger; admins see everyone, users themselves."""
        until = time.time()
        runs = [
            Run(r.owner, r.team, r.project, r.resource, r.pool, r.gpus, r.start, r.end)
            for r in scheduler.store.ledger(since=since)
            if who.admin or r.owner == who.user
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

    @app.post(f"{API}/policy/simulate")
    def policy_simulate(body: SimulateRequest, who: Auth) -> SimulationOut:
        """One placement cycle of the current queue under a changed estate; changes nothing."""
        if not who.admin:
            raise NotPermitted(
                "only an admin token can simulate a changed estate; ask the platform team"
            )
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
        states = dict(scheduler.pool_states)
        result = simulate(estate, queued, active, states, shares, now)
        out = SimulationOut.model_validate(result.to_dict())
        if body.include_trace:
            out.trace = Trace(queued, active, states, shares, now).to_dict()
        return out

    return app


def _task_out(task: Task, scheduler: Scheduler, detail: bool = False) -> TaskOut:
    out = TaskOut.of(task)
    waiting = scheduler.pending.get(task.id)
    if waiting is not None and task.state is TaskState.QUEUED:
        out.reason = f"{waiting.primary.sentence}: {waiting.detail}"
    if detail:
        out.events = scheduler.store.events(task.id)
        out.scalars = scheduler.store.scalars(task.id)
    return out


def _console_copy(task: Task, scheduler: Scheduler) -> Path:
    return scheduler.home / "console" / f"{task.id}.log"


def _read_console(task: Task, scheduler: Scheduler, offset: int) -> tuple[str, int]:
    """From the job directory when this server can read it, else from the reported copy."""
    candidates = [Path(task.job_dir) / "console.log"] if task.job_dir else []
    candidates.append(_console_copy(task, scheduler))
    for path in candidates:
        try:
            with path.open("rb") as f:
                f.seek(offset)
                data = f.read(1 << 20)
        except OSError:
            continue
        return data.decode("utf-8", "replace"), offset + len(data)
    return "", offset


def _save_console(task: Task, scheduler: Scheduler, offset: int, text: str) -> None:
    path = _console_copy(task, scheduler)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode()
    with path.open("ab") as f:
        size = f.tell()
        if offset <= size < offset + len(data):  # resends of what is there already are skipped
            f.write(data[size - offset :])
