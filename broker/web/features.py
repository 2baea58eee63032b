"""What this server's API offers beyond tasks, read from its own routes and task model, so that
pages show parameters, artifacts, clone and apps exactly when the API has them.

The shapes the pages expect when a feature is present:
- parameters: a task's JSON has `parameters`, an object of names to JSON values;
- artifacts: a task's JSON has `artifacts`, a list of objects with at least `name` (and
  `size` in bytes when known), downloaded from `GET /api/v1/tasks/{task_id}/artifacts/{name}`;
- clone: `POST /api/v1/tasks/{task_id}/clone` takes `{"parameters": {...}}` and answers the
  new task;
- apps: `GET /api/v1/apps` answers the catalogue, a list of objects with `name`, `description`
  and `schema` (a JSON Schema of the launch form); `GET /api/v1/apps/running` the running apps
  (`id`, `name`, `state`, `url`, `reason`); `POST /api/v1/apps/{name}/launch` launches with the
  form's values and `POST /api/v1/apps/running/{id}/stop` stops one.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.routing import APIRoute

from broker.api.app import API
from broker.api.schemas import TaskOut

ARTIFACT = f"{API}/tasks/{{task_id}}/artifacts/{{name}}"
CLONE = f"{API}/tasks/{{task_id}}/clone"
APPS = f"{API}/apps"
APPS_RUNNING = f"{API}/apps/running"
APP_LAUNCH = f"{API}/apps/{{name}}/launch"
APP_STOP = f"{API}/apps/running/{{app_id}}/stop"


@dataclass(frozen=True)
class Features:
    parameters: bool = False
    artifacts: bool = False
    artifact_download: bool = False
    clone: bool = False
    apps: bool = False


def _routes(app: FastAPI) -> set[tuple[str, str]]:
    return {
        (method, route.path)
        for route in app.routes
        if isinstance(route, APIRoute)
        for method in route.methods or ()
    }


def detect(app: FastAPI) -> Features:
    """The features of `app`, computed once per app."""
    found = getattr(app.state, "web_features", None)
    if isinstance(found, Features):
        return found
    routes = _routes(app)
    fields = TaskOut.model_fields
    found = Features(
        parameters="parameters" in fields,
        artifacts="artifacts" in fields,
        artifact_download=("GET", ARTIFACT) in routes,
        clone=("POST", CLONE) in routes,
        apps=("GET", APPS) in routes,
    )
    app.state.web_features = found
    return found
