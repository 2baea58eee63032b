"""The REST API on the server's app (OpenAPI at /docs and /openapi.json): its description, the
errors every operation may answer, and its routers (tasks, estate, sweeps, the SDK's, artifacts,
apps, identity, the agent link), thin over the task service (broker/tasks/). The app itself is
composed by broker/app.py."""

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from broker import authz
from broker.api import artifacts, datasets, keeping, models, sdk, sweeps, tunings
from broker.api.agent_link import agent_router
from broker.api.apps import router as apps_router
from broker.api.estate import estate_router
from broker.api.identity import identity_router
from broker.api.tasks import tasks_router
from broker.artifacts import ArtifactStore
from broker.control.loop import ControlLoop
from broker.datasets.blobs import blobs_for
from broker.http.callers import Auth, Caller
from broker.http.paths import API
from broker.identity.resolve import Identities
from broker.tasks.datasets import DatasetService
from broker.tasks.keeping import Retention
from broker.tasks.models import ModelService
from broker.tasks.service import TaskService
from broker.tasks.tuning import TuningService


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
# What the app's OpenAPI document says of the API (the app is the API's, its document too).
OPENAPI: dict[str, Any] = {
    "title": "Klique",
    "version": "0.1.0",
    "responses": ERROR_RESPONSES,
    "description": "Submit tasks to compute resources; follow, explain and cancel them.",
}


def mount_api(app: FastAPI, control: ControlLoop, identities: Identities) -> None:
    """Every API router on `app`, in the order their paths are matched."""
    settings = control.estate.artifacts
    app.state.artifacts = ArtifactStore(settings.store, control.home, settings.max_bytes)
    app.include_router(sdk.router)
    app.include_router(keeping.router)
    control.chores.append(Retention(control, app.state.artifacts))  # the estate's retention
    app.include_router(artifacts.router)
    app.state.models = ModelService(control)  # the model registry's router finds it
    app.include_router(models.router)
    app.state.tunings = TuningService(control)  # tuning's router finds it
    app.include_router(tunings.router)
    app.state.datasets = DatasetService(control)  # the datasets' router finds them
    app.state.dataset_blobs = blobs_for(control.estate.datasets, app.state.artifacts)
    app.include_router(datasets.router)
    app.include_router(sweeps.router)
    app.include_router(identity_router(identities, API))

    def admin(who: Auth) -> Caller:
        authz.check_admin(who, "do this")
        return who

    app.include_router(agent_router(control, admin))

    tasks = TaskService(control)
    app.state.tasks = tasks  # the SDK's, sweeps' and artifacts' routers find it (service_of)
    app.include_router(estate_router(control))
    app.include_router(tasks_router(tasks))
    app.include_router(apps_router, prefix=API)
