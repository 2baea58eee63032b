"""Tuning over HTTP (/tunings...): thin over broker/tasks/tuning.py. A user starts a tuning of
a base task they may read, lists and reads their own, and stops one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi import Path as PathParam

from broker.http.callers import Auth
from broker.http.paths import API
from broker.tasks.tuning import TuningService
from broker.tasks.tuning_schemas import TuningDetailOut, TuningIn, TuningOut

router = APIRouter(prefix=API)
TuningId = Annotated[int, PathParam(ge=1, lt=2**63, description="A tuning's id.")]


def service_of(request: Request) -> TuningService:
    """The app's tuning service (set where the API is mounted)."""
    tunings: TuningService = request.app.state.tunings
    return tunings


Tunings = Annotated[TuningService, Depends(service_of)]


@router.post("/tunings", status_code=201)
def create(body: TuningIn, tunings: Tunings, who: Auth) -> TuningOut:
    """A search over a base task's parameters; its trials are clones of it, run as you."""
    return tunings.create(who, body)


@router.get("/tunings")
def listing(
    tunings: Tunings,
    who: Auth,
    all_users: Annotated[bool, Query(alias="all")] = False,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> list[TuningOut]:
    """Your tunings, newest first (an admin's `all=true`: everyone's)."""
    return tunings.listing(who, all_users, limit)


@router.get("/tunings/{tuning_id}")
def show(tuning_id: TuningId, tunings: Tunings, who: Auth) -> TuningDetailOut:
    """A tuning, its trials and the best one so far."""
    return tunings.show(who, tuning_id)


@router.post("/tunings/{tuning_id}/stop")
def stop(tuning_id: TuningId, tunings: Tunings, who: Auth) -> TuningOut:
    """Ask no more trials and cancel those running."""
    return tunings.stop(who, tuning_id)
