"""The bodies of the app operations (broker/tasks/apps.py): launch, lock and route requests,
and apps, locks, routes and running apps as every adapter shows them."""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from broker.names import LINE, NAME, PROJECT

Name = Annotated[str, Field(pattern=NAME)]
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
    # The registry's versions it serves: {ref, name, version} of each `registry:` parameter,
    # resolved at launch (a relaunch resolves them again).
    models: list[dict[str, Any]] = []
    form: dict[str, Any]  # the launch form, as `klique app export` writes it
    created_at: float
    started_at: float | None
    finished_at: float | None
