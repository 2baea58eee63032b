"""What this server's API offers beyond tasks, read from its own routes and task model, so that
pages show parameters, artifacts, clone and apps exactly when the API has them.

The shapes the pages expect when a feature is present:
- parameters: a task's JSON has `parameters`, an object of names to JSON values;
- artifacts: a task's JSON has `artifacts`, a list of objects with at least `name` (and
  `size` in bytes when known), downloaded from `GET /api/v1/tasks/{task_id}/artifacts/{name}`;
- clone (the SDK's, broker/api/sdk.py): `POST /api/v1/sdk/tasks/{task_id}/clone` takes
  `{"parameters": {...}}` and answers the new task;
- apps (broker/api/apps.py): `GET /api/v1/apps` answers the catalogue (`name`, `kind`,
  `description`, `resources`, `form`: a JSON Schema of the launch parameters, `locked`,
  `lock_reason`); `GET /api/v1/apps/instances` the caller's running apps (`id`, `app`, `state`,
  `reason`, `path`: its route on this server, `ready`); `POST /api/v1/apps/{name}/launch`
  launches with `{"resource", "params"}` and `POST /api/v1/apps/instances/{task_id}/stop`
  stops one.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI

from broker.http.paths import API
from broker.tasks.schemas import TaskOut

ARTIFACT = f"{API}/tasks/{{task_id}}/artifacts/{{name}}"
CLONE = f"{API}/sdk/tasks/{{task_id}}/clone"
APPS = f"{API}/apps"
APPS_RUNNING = f"{API}/apps/instances"
APP_LAUNCH = f"{API}/apps/{{name}}/launch"
APP_STOP = f"{API}/apps/instances/{{task_id}}/stop"


@dataclass(frozen=True)
class Features:
    parameters: bool = False
    artifacts: bool = False
    artifact_download: bool = False
    clone: bool = False
    apps: bool = False


def _routes(app: FastAPI) -> set[tuple[str, str]]:
    """(METHOD, path) of every API operation, as the app's own OpenAPI document lists them
    (included routers too, however the framework keeps them)."""
    return {
        (method.upper(), path)
        for path, operations in app.openapi().get("paths", {}).items()
        for method in operations
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
