"""The API of apps and routes: the catalogue, launches, running apps, locks and static routes.
Thin over the app operations (broker/tasks/apps.py), which the web UI calls too."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi import Path as PathParam

from broker.http.callers import Auth, control_of
from broker.names import NAME
from broker.tasks.app_schemas import (
    AppOut,
    InstanceOut,
    LaunchRequest,
    LockOut,
    LockRequest,
    RouteOut,
    RouteRequest,
)
from broker.tasks.apps import AppService

router = APIRouter(tags=["apps"])
AppName = Annotated[str, PathParam(pattern=NAME, description="An app of the catalogue.")]
RouteName = Annotated[str, PathParam(pattern=NAME, description="A static route.")]
InstanceId = Annotated[int, PathParam(ge=1, lt=2**63, description="A running app's task id.")]


def apps_of(request: Request) -> AppService:
    """The app operations over the app's control loop and its route hub."""
    return AppService(control_of(request), request.app.state.route_hub)


Apps = Annotated[AppService, Depends(apps_of)]


@router.get("/apps")
def list_apps(apps: Apps, who: Auth) -> list[AppOut]:
    return apps.apps(who)


@router.get("/apps/instances")
def list_instances(
    apps: Apps, who: Auth, all_users: bool = False, ended: bool = False
) -> list[InstanceOut]:
    """Your apps (everyone's with all_users, for admins); those not yet ended unless `ended`."""
    return apps.instances(who, all_users, ended)


@router.get("/apps/instances/{task_id}")
def show_instance(task_id: InstanceId, apps: Apps, who: Auth) -> InstanceOut:
    return apps.instance(who, task_id)


@router.post("/apps/instances/{task_id}/stop")
async def stop_instance(task_id: InstanceId, apps: Apps, who: Auth) -> InstanceOut:
    """Stop a running app: its route takes no new request, those in flight finish (up to a
    few seconds), then the task is cancelled and its compute resource freed."""
    return await apps.stop(who, task_id)


@router.get("/apps/{name}")
def show_app(name: AppName, apps: Apps, who: Auth) -> AppOut:
    return apps.app(who, name)


@router.post("/apps/{name}/launch", status_code=201)
def launch_app(name: AppName, body: LaunchRequest, apps: Apps, who: Auth) -> InstanceOut:
    """Launch an app as a task of kind application; refused, with the rule and the fix, when
    the app is locked or a running-app quota is full."""
    return apps.launch(who, name, body)


@router.put("/apps/{name}/lock")
def lock_app(name: AppName, body: LockRequest, apps: Apps, who: Auth) -> LockOut:
    """(admin) Refuse new launches of an app, with the reason users will read."""
    return apps.lock(who, name, body.reason)


@router.delete("/apps/{name}/lock")
def unlock_app(name: AppName, apps: Apps, who: Auth) -> LockOut:
    """(admin) Let an app be launched again."""
    return apps.unlock(who, name)


@router.get("/routes")
def list_routes(apps: Apps, who: Auth) -> list[RouteOut]:
    return apps.routes(who)


@router.post(
    "/routes", status_code=201, responses={409: {"description": "a route of that name exists"}}
)
def create_route(body: RouteRequest, apps: Apps, who: Auth) -> RouteOut:
    """(admin) A static route: endpoints launched behind it serve its teams, one after another
    or several at once; it outlives them."""
    return apps.add_route(who, body.name, body.teams, body.apps)


@router.delete("/routes/{name}")
def delete_route(name: RouteName, apps: Apps, who: Auth) -> dict[str, bool]:
    """(admin) Remove a static route made through the API (the estate's stay)."""
    apps.remove_route(who, name)
    return {"ok": True}
