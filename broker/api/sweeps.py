"""Many tasks in one request over REST: a batch (POST /tasks/batch) or a sweep (POST /sweeps);
thin over the task service (broker/tasks/batches.py has the rules)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi import Path as PathParam

from broker.api.tasks import Tasks
from broker.http.callers import Auth
from broker.http.paths import API
from broker.tasks.batches import BatchOut, BatchRequest, SweepOut, SweepRequest
from broker.tasks.schemas import TaskOut

router = APIRouter(prefix=API)
SweepId = Annotated[int, PathParam(ge=1, lt=2**63, description="A sweep's id.")]


@router.post("/tasks/batch", status_code=201)
def create_batch(body: BatchRequest, tasks: Tasks, who: Auth) -> BatchOut:
    """Many tasks in one transaction: all are made, or none (the error names the item)."""
    return tasks.create_many(who, body.tasks, None)


@router.post("/sweeps", status_code=201)
def create_sweep(body: SweepRequest, tasks: Tasks, who: Auth) -> BatchOut:
    """A batch whose tasks share one sweep id, to list and cancel together."""
    return tasks.create_many(who, body.tasks, body.name)


@router.get("/sweeps/{sweep_id}")
def show_sweep(sweep_id: SweepId, tasks: Tasks, who: Auth) -> SweepOut:
    return tasks.sweep(who, sweep_id)


@router.get("/sweeps/{sweep_id}/tasks")
def sweep_tasks(
    sweep_id: SweepId,
    tasks: Tasks,
    who: Auth,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    before: Annotated[int | None, Query(ge=1, lt=2**63)] = None,
) -> list[TaskOut]:
    """The sweep's tasks, newest first, a page at a time: pass the last id seen as `before`."""
    return tasks.sweep_tasks(who, sweep_id, limit, before)


@router.post("/sweeps/{sweep_id}/cancel")
async def cancel_sweep(sweep_id: SweepId, tasks: Tasks, who: Auth) -> SweepOut:
    """Cancel every task of the sweep that has not ended. Queued ones end at once, in one
    transaction; running ones are asked to stop, and their pools confirm it shortly."""
    return await tasks.cancel_sweep(who, sweep_id)
