"""The API of apps and routes: the catalogue, launches, running apps, locks and static routes.
Every launch goes through broker/apps/launch.py and the common create path."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Request
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field, field_validator

from broker import authz
from broker.apps import launch
from broker.apps.catalogue import App, load_catalogue
from broker.authz import Action
from broker.control.loop import Scheduler
from broker.domain import StaticRoute, Task, TaskSpec
from broker.errors import KliqueError, NotFound, NotPermitted
from broker.http.callers import Auth, Caller, scheduler_of
from broker.names import LINE, NAME, PROJECT
from broker.store.apps import AppStore
from broker.tasks.create import check_task, new_task

router = APIRouter(tags=["apps"])
Name = Annotated[str, Field(pattern=NAME)]
AppName = Annotated[str, PathParam(pattern=NAME, description="An app of the catalogue.")]
RouteName = Annotated[str, PathParam(pattern=NAME, description="A static route.")]
InstanceId = Annotated[int, PathParam(ge=1, lt=2**63, description="A running app's task id.")]
_PARAMS_BYTES = 256 * 1024


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LaunchRequest(_Body):
    resource: Name | None = None
    params: dict[Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_]{0,63}$")], Any] = Field(
        {}, max_length=100
    )
    name: str = Field("", max_length=200, pattern=LINE)
    project: str = Field("default", pattern=PROJECT)
    route: Name | None = Field(None, description="A static route to serve behind (endpoints).")
    teams: list[Name] = Field([], max_length=100, description="Teams that may call an endpoint.")
    walltime_s: int | None = Field(None, ge=1, le=366 * 86400)

    @field_validator("params")
    @classmethod
    def _bounded(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(json.dumps(value)) > _PARAMS_BYTES:
            raise ValueError(f"the parameters are over {_PARAMS_BYTES} bytes of JSON")
        return value


class LockRequest(_Body):
    reason: str = Field(min_length=1, max_length=500, pattern=LINE)


class RouteRequest(_Body):
    name: Name
    teams: list[Name] = Field([], max_length=100)
    apps: list[Name] = Field([], max_length=100)


class AppOut(BaseModel):
    name: str
    kind: str
    description: str
    resources: list[str]
    form: dict[str, Any]
    locked: bool
    lock_reason: str


class LockOut(BaseModel):
    app: str
    locked: bool
    reason: str
    locked_by: str


class RouteOut(BaseModel):
    name: str
    teams: list[str]
    apps: list[str]
    created_by: str
    path: str
    instances: list[int]  # the running apps behind it
    ready: list[int]  # those that answer through it now


class InstanceOut(BaseModel):
    id: int
    app: str
    kind: str
    owner: str
    team: str | None
    resource: str
    project: str
    state: str
    reason: str
    route: str
    path: str  # /routes/NAME/ on this server
    static: bool
    teams: list[str]
    ready: bool
    params: dict[str, Any]
    form: dict[str, Any]  # the launch form, as `klique app export` writes it
    created_at: float
    started_at: float | None
    finished_at: float | None


def catalogue(scheduler: Scheduler) -> dict[str, App]:
    return load_catalogue(scheduler.estate)


def static_routes(scheduler: Scheduler) -> dict[str, StaticRoute]:
    """The estate's routes, then those made through the API."""
    return launch.static_routes(AppStore(scheduler.store).routes(), scheduler.estate)


def the_app(scheduler: Scheduler, name: str) -> App:
    apps = catalogue(scheduler)
    if name not in apps:
        raise NotFound(f"no app {name!r}; known: {', '.join(sorted(apps))} (`klique app list`)")
    return apps[name]


def launch_form_of(task: Task) -> launch.LaunchForm:
    """The form an app task was launched with, as `klique app export` writes it."""
    app = task.spec.app or {}
    return launch.LaunchForm(
        app=str(app.get("name")),
        resource=task.spec.resource,
        params=dict(app.get("params") or {}),
        name=task.spec.name,
        project=task.spec.project,
        route=app.get("route") if app.get("static") else None,
        teams=tuple(app.get("teams") or ()),
        walltime_s=app.get("walltime_s"),
    )


def instance_out(task: Task, request: Request) -> InstanceOut:
    app = task.spec.app or {}
    hub = request.app.state.route_hub
    form = launch_form_of(task)
    route = str(app.get("route"))
    return InstanceOut(
        id=task.id,
        app=str(app.get("name")),
        kind=str(app.get("kind")),
        owner=task.owner,
        team=task.team,
        resource=task.spec.resource,
        project=task.spec.project,
        state=task.state.value,
        reason=task.reason,
        route=route,
        path=f"{launch.ROUTES_PREFIX}{route}/",
        static=bool(app.get("static")),
        teams=list(app.get("teams") or ()),
        ready=hub.is_ready(task.id),
        params=dict(app.get("params") or {}),
        form=form.to_json(),
        created_at=task.created_at,
        started_at=task.started_at,
        finished_at=task.finished_at,
    )


@router.get("/apps")
def list_apps(request: Request, who: Auth) -> list[AppOut]:
    scheduler = scheduler_of(request)
    locks = AppStore(scheduler.store).locks()
    return [_app_out(app, locks) for app in catalogue(scheduler).values()]


def _app_out(app: App, locks: dict[str, Any]) -> AppOut:
    lock = locks.get(app.name)
    return AppOut(
        name=app.name,
        kind=app.kind,
        description=app.description,
        resources=list(app.resources),
        form=app.form,
        locked=lock is not None,
        lock_reason=lock.reason if lock else "",
    )


@router.get("/apps/instances")
def list_instances(
    request: Request, who: Auth, all_users: bool = False, ended: bool = False
) -> list[InstanceOut]:
    """Your apps (everyone's with all_users, for admins); those not yet ended unless `ended`."""
    scheduler = scheduler_of(request)
    owner = authz.owner_filter(who, None if all_users else who.user)
    states = None if ended else launch.COUNTED
    tasks = scheduler.store.tasks(owner=owner, states=states, newest_first=True, with_diff=False)
    return [instance_out(t, request) for t in tasks if t.spec.kind == launch.APPLICATION][:1000]


@router.get("/apps/instances/{task_id}")
def show_instance(task_id: InstanceId, request: Request, who: Auth) -> InstanceOut:
    return instance_out(_own_instance(request, task_id, who, Action.READ_TASK), request)


@router.post("/apps/instances/{task_id}/stop")
async def stop_instance(task_id: InstanceId, request: Request, who: Auth) -> InstanceOut:
    """Stop a running app: its route takes no new request, those in flight finish (up to a
    few seconds), then the task is cancelled and its compute resource freed."""
    scheduler = scheduler_of(request)
    task = _own_instance(request, task_id, who, Action.CANCEL)
    if not task.state.final:
        await request.app.state.route_hub.drain(task.id)
        task = await scheduler.cancel(task)
    return instance_out(task, request)


def _own_instance(request: Request, task_id: int, who: Caller, action: Action) -> Task:
    """An app task, if authz lets the caller do `action` to it: NotFound alike for a task that
    is not theirs and one that is no app."""
    absent = NotFound(f"no app {task_id} of yours; `klique app ls` lists your apps")
    try:
        task = authz.find_task(scheduler_of(request).store.get, who, action, task_id)
    except NotFound:
        raise absent from None
    if task.spec.kind != launch.APPLICATION:
        raise absent
    return task


@router.get("/apps/{name}")
def show_app(name: AppName, request: Request, who: Auth) -> AppOut:
    scheduler = scheduler_of(request)
    return _app_out(the_app(scheduler, name), AppStore(scheduler.store).locks())


@router.post("/apps/{name}/launch", status_code=201)
def launch_app(name: AppName, body: LaunchRequest, request: Request, who: Auth) -> InstanceOut:
    """Launch an app as a task of kind application; refused, with the rule and the fix, when
    the app is locked or a running-app quota is full."""
    scheduler = scheduler_of(request)
    form = launch.LaunchForm(
        app=name,
        resource=body.resource,
        params=dict(body.params),
        name=body.name,
        project=body.project,
        route=body.route,
        teams=tuple(body.teams),
        walltime_s=body.walltime_s,
    )
    task = launch_task(scheduler, who, form, request.app.state.route_hub)
    return instance_out(task, request)


def launch_task(scheduler: Scheduler, who: Caller, form: launch.LaunchForm, hub: Any) -> Task:
    """Every app task is made here, whatever asked for it: a launch, a clone or relaunch of an
    app task, an imported form. The app's rules first (its lock, its compute resources, a
    static route's teams, the running-app quotas), then those of any task
    (broker/tasks/create.py)."""
    app = the_app(scheduler, form.app)
    launch.check_lock(app, AppStore(scheduler.store).locks())
    resource = form.resource or scheduler.estate.default_resource or ""
    launch.check_resource(app, resource)
    if form.route is not None:
        route = static_routes(scheduler).get(form.route)
        launch.check_route(app, route, form.route, who.user, who.team, who.admin)
    elif form.teams and app.kind != "endpoint":
        raise KliqueError(f"app {app.name} is a session, open to its owner only: drop teams")
    check_task(scheduler, who, TaskSpec(command=("true",), resource=resource))  # known, permitted
    route_name = form.route or launch.route_name(app)
    spec = launch.app_spec(
        app, form, scheduler.estate, resource, route_name, form.route is not None
    )
    with launch.quota_lock():
        running = [
            t.team
            for t in scheduler.store.tasks(states=launch.COUNTED, with_diff=False)
            if t.spec.kind == launch.APPLICATION
        ]
        launch.check_quota(scheduler.estate, who.team, running)
        task = new_task(scheduler, who, spec, app_admitted=True)
    hub.forget_routes()
    return task


def relaunch_task(
    scheduler: Scheduler, who: Caller, task: Task, hub: Any, resource: str | None, name: str | None
) -> Task:
    """An app task again (a clone): its launch form, on `resource` and named `name` when given,
    through every rule a launch passes, on a route of its own unless it serves a static one."""
    form = launch_form_of(task)
    edited = replace(form, resource=resource or form.resource, name=name or form.name)
    return launch_task(scheduler, who, edited, hub)


@router.put("/apps/{name}/lock")
def lock_app(name: AppName, body: LockRequest, request: Request, who: Auth) -> LockOut:
    """(admin) Refuse new launches of an app, with the reason users will read."""
    authz.check_admin(who, "lock an app")
    scheduler = scheduler_of(request)
    the_app(scheduler, name)
    lock = AppStore(scheduler.store).lock(name, body.reason, who.user)
    return LockOut(app=name, locked=True, reason=lock.reason, locked_by=lock.locked_by)


@router.delete("/apps/{name}/lock")
def unlock_app(name: AppName, request: Request, who: Auth) -> LockOut:
    """(admin) Let an app be launched again."""
    authz.check_admin(who, "unlock an app")
    scheduler = scheduler_of(request)
    the_app(scheduler, name)
    AppStore(scheduler.store).unlock(name)
    return LockOut(app=name, locked=False, reason="", locked_by="")


@router.get("/routes")
def list_routes(request: Request, who: Auth) -> list[RouteOut]:
    scheduler = scheduler_of(request)
    return [_route_out(r, request) for r in static_routes(scheduler).values()]


def _route_out(route: StaticRoute, request: Request) -> RouteOut:
    hub = request.app.state.route_hub
    return RouteOut(
        name=route.name,
        teams=list(route.teams),
        apps=list(route.apps),
        created_by=route.created_by,
        path=f"{launch.ROUTES_PREFIX}{route.name}/",
        instances=hub.instances_of(route.name),
        ready=hub.ready_of(route.name),
    )


@router.post(
    "/routes", status_code=201, responses={409: {"description": "a route of that name exists"}}
)
def create_route(body: RouteRequest, request: Request, who: Auth) -> RouteOut:
    """(admin) A static route: endpoints launched behind it serve its teams, one after another
    or several at once; it outlives them."""
    authz.check_admin(who, "create a static route")
    scheduler = scheduler_of(request)
    route = StaticRoute(body.name, tuple(body.teams), tuple(body.apps), who.user)
    if body.name in scheduler.estate.routes or not AppStore(scheduler.store).add_route(route):
        raise HTTPException(409, f"route {body.name} exists already; choose another name")
    request.app.state.route_hub.forget_routes()
    return _route_out(route, request)


@router.delete("/routes/{name}")
def delete_route(name: RouteName, request: Request, who: Auth) -> dict[str, bool]:
    """(admin) Remove a static route made through the API (the estate's stay)."""
    authz.check_admin(who, "delete a static route")
    scheduler = scheduler_of(request)
    if name in scheduler.estate.routes:
        raise NotPermitted(f"route {name} is declared in the estate; remove it there")
    if not AppStore(scheduler.store).remove_route(name):
        raise NotFound(f"no static route {name}; `klique app routes` lists them")
    request.app.state.route_hub.forget_routes()
    return {"ok": True}
