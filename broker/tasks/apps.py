"""The operations on apps, one place for the REST API, the web UI and the SDK's clone: the
catalogue, launches (and relaunches), running apps, stopping one, locks and static routes. Each
takes the caller, asks broker/authz.py and raises Klique's own errors; every app task is made
by `AppService.launch_task`, through the app's rules (broker/apps/launch.py) and then those of
any task (broker/tasks/create.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Protocol

from broker import authz
from broker.apps import launch
from broker.apps.catalogue import App, load_catalogue
from broker.apps.launch import LaunchForm
from broker.authz import Action
from broker.domain import StaticRoute, Task, TaskSpec
from broker.errors import Conflict, KliqueError, NotFound, NotPermitted
from broker.identity.resolve import Caller
from broker.store.apps import AppStore
from broker.store.rows import AppLock
from broker.tasks.app_schemas import (
    AppOut,
    InstanceOut,
    LaunchRequest,
    LockOut,
    RouteOut,
)
from broker.tasks.control import TaskControl
from broker.tasks.create import check_task, new_task
from broker.tasks.models import ModelService
from broker.tasks.schemas import TaskOut
from broker.tasks.sdk_schemas import CloneIn
from broker.tasks.service import TaskService

MOST_INSTANCES = 1000  # a listing of running apps shows at most this many


class RouteHub(Protocol):
    """What the operations ask of the route proxy (broker/route_proxy/hub.py's `Hub`)."""

    def is_ready(self, task_id: int) -> bool: ...

    def instances_of(self, route: str) -> list[int]: ...

    def ready_of(self, route: str) -> list[int]: ...

    def forget_routes(self) -> None: ...

    async def drain(self, task_id: int) -> None: ...


def form_of(name: str, body: LaunchRequest) -> LaunchForm:
    """A launch request's form for the app `name`."""
    return LaunchForm(
        app=name,
        resource=body.resource,
        params=dict(body.params),
        name=body.name,
        project=body.project,
        route=body.route,
        teams=tuple(body.teams),
        walltime_s=body.walltime_s,
    )


def launch_form_of(task: Task) -> LaunchForm:
    """The form an app task was launched with, as `klique app export` writes it."""
    app = task.spec.app or {}
    return LaunchForm(
        app=str(app.get("name")),
        resource=task.spec.resource,
        params=dict(app.get("params") or {}),
        name=task.spec.name,
        project=task.spec.project,
        route=app.get("route") if app.get("static") else None,
        teams=tuple(app.get("teams") or ()),
        walltime_s=app.get("walltime_s"),
    )


class AppService:
    """The app operations over one control loop (its store, its estate) and the route hub."""

    def __init__(self, control: TaskControl, hub: RouteHub) -> None:
        self.control = control
        self.hub = hub
        self.store = AppStore(control.store)
        self.models = ModelService(control)  # resolves `registry:NAME@REF` parameters

    # The catalogue and its locks.

    def catalogue(self) -> dict[str, App]:
        return load_catalogue(self.control.estate)

    def the_app(self, name: str) -> App:
        apps = self.catalogue()
        if name not in apps:
            raise NotFound(f"no app {name!r}; known: {', '.join(sorted(apps))} (`klique app list`)")
        return apps[name]

    def apps(self, who: Caller) -> list[AppOut]:
        locks = self.store.locks()
        return [app_out(app, locks) for app in self.catalogue().values()]

    def app(self, who: Caller, name: str) -> AppOut:
        return app_out(self.the_app(name), self.store.locks())

    def lock(self, who: Caller, name: str, reason: str) -> LockOut:
        """(admin) Refuse new launches of an app, with the reason users will read."""
        authz.check_admin(who, "lock an app")
        self.the_app(name)
        lock = self.store.lock(name, reason, who.user)
        return LockOut(app=name, locked=True, reason=lock.reason, locked_by=lock.locked_by)

    def unlock(self, who: Caller, name: str) -> LockOut:
        """(admin) Let an app be launched again."""
        authz.check_admin(who, "unlock an app")
        self.the_app(name)
        self.store.unlock(name)
        return LockOut(app=name, locked=False, reason="", locked_by="")

    # Launches and running apps.

    def launch(self, who: Caller, name: str, body: LaunchRequest) -> InstanceOut:
        """Launch an app as a task of kind application; refused, with the rule and the fix,
        when the app is locked or a running-app quota is full."""
        return self.instance_out(self.launch_task(who, form_of(name, body)))

    def launch_task(self, who: Caller, form: LaunchForm) -> Task:
        """Every app task is made here, whatever asked for it: a launch, a clone or relaunch of
        an app task, an imported form. The app's rules first (its lock, its compute resources,
        a static route's teams, the running-app quotas), then those of any task
        (broker/tasks/create.py)."""
        control = self.control
        app = self.the_app(form.app)
        launch.check_lock(app, self.store.locks())
        resource = form.resource or control.estate.default_resource or ""
        launch.check_resource(app, resource)
        if form.route is not None:
            route = self.static_routes().get(form.route)
            launch.check_route(app, route, form.route, who.user, who.team, who.admin)
        elif form.teams and app.kind != "endpoint":
            raise KliqueError(f"app {app.name} is a session, open to its owner only: drop teams")
        check_task(control, who, TaskSpec(command=("true",), resource=resource))
        route_name = form.route or launch.route_name(app)
        static = form.route is not None
        spec = launch.app_spec(app, form, control.estate, resource, route_name, static)
        spec = self.models.with_models(who, spec)
        with launch.quota_lock():
            running = [t.team for t in running_apps(control)]
            launch.check_quota(control.estate, who.team, running)
            task = new_task(control, who, spec, app_admitted=True)
        self.hub.forget_routes()
        return task

    def relaunch(self, who: Caller, task: Task, resource: str | None, name: str | None) -> Task:
        """An app task again (a clone): its launch form, on `resource` and named `name` when
        given, through every rule a launch passes, on a route of its own unless it serves a
        static one."""
        form = launch_form_of(task)
        edited = replace(form, resource=resource or form.resource, name=name or form.name)
        return self.launch_task(who, edited)

    def instances(
        self, who: Caller, all_users: bool = False, ended: bool = False
    ) -> list[InstanceOut]:
        """Your apps (everyone's with all_users, for admins); those not yet ended unless
        `ended`."""
        owner = authz.owner_filter(who, None if all_users else who.user)
        states = None if ended else launch.COUNTED
        tasks = self.control.store.tasks(
            owner=owner, states=states, newest_first=True, with_diff=False
        )
        apps = [t for t in tasks if t.spec.kind == launch.APPLICATION]
        return [self.instance_out(t) for t in apps[:MOST_INSTANCES]]

    def instance(self, who: Caller, task_id: int) -> InstanceOut:
        return self.instance_out(self.own_instance(who, task_id, Action.READ_TASK))

    async def stop(self, who: Caller, task_id: int) -> InstanceOut:
        """Stop a running app: its route takes no new request, those in flight finish (up to
        a few seconds), then the task is cancelled and its compute resource freed."""
        task = await asyncio.to_thread(self.own_instance, who, task_id, Action.CANCEL)
        if not task.state.final:
            await self.hub.drain(task.id)
            task = await self.control.cancel(task)
        return self.instance_out(task)

    def own_instance(self, who: Caller, task_id: int, action: Action) -> Task:
        """An app task, if authz lets the caller do `action` to it: NotFound alike for a task
        that is not theirs and one that is no app."""
        absent = NotFound(f"no app {task_id} of yours; `klique app ls` lists your apps")
        try:
            task = authz.find_task(self.control.store.get, who, action, task_id)
        except NotFound:
            raise absent from None
        if task.spec.kind != launch.APPLICATION:
            raise absent
        return task

    def instance_out(self, task: Task) -> InstanceOut:
        app = task.spec.app or {}
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
            ready=self.hub.is_ready(task.id),
            params=dict(app.get("params") or {}),
            models=[
                {"ref": m["ref"], "name": m["name"], "version": m["version"]}
                for m in app.get("models") or ()
            ],
            form=launch_form_of(task).to_json(),
            created_at=task.created_at,
            started_at=task.started_at,
            finished_at=task.finished_at,
        )

    # Static routes.

    def static_routes(self) -> dict[str, StaticRoute]:
        return static_routes(self.control)

    def routes(self, who: Caller) -> list[RouteOut]:
        return [self.route_out(r) for r in self.static_routes().values()]

    def add_route(self, who: Caller, name: str, teams: list[str], apps: list[str]) -> RouteOut:
        """(admin) A static route: endpoints launched behind it serve its teams, one after
        another or several at once; it outlives them."""
        authz.check_admin(who, "create a static route")
        route = StaticRoute(name, tuple(teams), tuple(apps), who.user)
        if route.name in self.control.estate.routes or not self.store.add_route(route):
            raise Conflict(f"route {route.name} exists already; choose another name")
        self.hub.forget_routes()
        return self.route_out(route)

    def remove_route(self, who: Caller, name: str) -> None:
        """(admin) Remove a static route made through the API (the estate's stay)."""
        authz.check_admin(who, "delete a static route")
        if name in self.control.estate.routes:
            raise NotPermitted(f"route {name} is declared in the estate; remove it there")
        if not self.store.remove_route(name):
            raise NotFound(f"no static route {name}; `klique app routes` lists them")
        self.hub.forget_routes()

    def route_out(self, route: StaticRoute) -> RouteOut:
        return RouteOut(
            name=route.name,
            teams=list(route.teams),
            apps=list(route.apps),
            created_by=route.created_by,
            path=f"{launch.ROUTES_PREFIX}{route.name}/",
            instances=self.hub.instances_of(route.name),
            ready=self.hub.ready_of(route.name),
        )


def clone_task(
    tasks: TaskService, apps: AppService, actor: Caller, task_id: int, body: CloneIn
) -> TaskOut:
    """A new queued task with the same code, packages and parameters (edited); an app task
    again through every rule of a launch. The SDK's clone and the web UI's both."""
    task = tasks.find_record(actor, task_id)
    if task.spec.kind == launch.APPLICATION:
        return tasks.out(apps.relaunch(actor, task, body.resource, body.name), detail=True)
    return tasks.clone(actor, task, body)


def static_routes(control: TaskControl) -> dict[str, StaticRoute]:
    """The estate's routes, then those made through the API."""
    return launch.static_routes(AppStore(control.store).routes(), control.estate)


def running_apps(control: TaskControl) -> list[Task]:
    """Every app task that has not ended (those the running-app quotas count)."""
    tasks = control.store.tasks(states=launch.COUNTED, with_diff=False)
    return [t for t in tasks if t.spec.kind == launch.APPLICATION]


def app_out(app: App, locks: dict[str, AppLock]) -> AppOut:
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
