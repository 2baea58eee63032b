"""Many tasks in one request: a batch (POST /tasks/batch) or a sweep (POST /sweeps), whose tasks
share one sweep id to be listed and cancelled together.

Every item passes the same checks as one `klique submit` (broker/api/create.py); all items are
checked before any is made, and all are made in one transaction: all or none. An item's error
names its index and field. The estate's `limits.max_batch` bounds the items of one request."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi import Path as PathParam
from pydantic import BaseModel, Field

from broker import authz
from broker.api.auth import Auth, Caller, scheduler_of
from broker.api.create import check_batch_size, check_task, spec_of
from broker.api.schemas import SubmitRequest, TaskOut, _Body
from broker.api.sdk_schemas import Parameters
from broker.domain import TaskSpec, TaskState
from broker.errors import KliqueError, NotFound, NotPermitted
from broker.names import LINE
from broker.scheduler.loop import Scheduler

router = APIRouter(prefix="/api/v1")
SweepId = Annotated[int, PathParam(ge=1, lt=2**63, description="A sweep's id.")]
_EARLY = (TaskState.CREATED, TaskState.QUEUED, TaskState.HELD, TaskState.PLACED)
_SHOWN_ERRORS = 10  # item errors named in one answer


class BatchItem(SubmitRequest):
    """One task of a batch: `klique submit`'s fields, and the parameters it was made from."""

    parameters: Parameters = {}


class BatchRequest(_Body):
    tasks: list[BatchItem] = Field(min_length=1, max_length=1_000_000)


class SweepRequest(BatchRequest):
    name: str = Field("", max_length=200, pattern=LINE)


class BatchOut(BaseModel):
    sweep: int | None  # the sweep's id; None for a batch
    tasks: list[TaskOut]


class SweepOut(BaseModel):
    id: int
    owner: str
    team: str | None
    name: str
    size: int
    created_at: float
    states: dict[str, int]  # how many of its tasks are in each state


@router.post("/tasks/batch", status_code=201)
def create_batch(body: BatchRequest, request: Request, who: Auth) -> BatchOut:
    """Many tasks in one transaction: all are made, or none (the error names the item)."""
    return _create(scheduler_of(request), who, body.tasks, None)


@router.post("/sweeps", status_code=201)
def create_sweep(body: SweepRequest, request: Request, who: Auth) -> BatchOut:
    """A batch whose tasks share one sweep id, to list and cancel together."""
    return _create(scheduler_of(request), who, body.tasks, body.name)


@router.get("/sweeps/{sweep_id}")
def show_sweep(sweep_id: SweepId, request: Request, who: Auth) -> SweepOut:
    return SweepOut(**_own_sweep(scheduler_of(request), sweep_id, who))


@router.get("/sweeps/{sweep_id}/tasks")
def sweep_tasks(
    sweep_id: SweepId,
    request: Request,
    who: Auth,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    before: Annotated[int | None, Query(ge=1, lt=2**63)] = None,
) -> list[TaskOut]:
    """The sweep's tasks, newest first, a page at a time: pass the last id seen as `before`."""
    from broker.api.app import _task_out

    scheduler = scheduler_of(request)
    _own_sweep(scheduler, sweep_id, who)
    tasks = scheduler.store.tasks(
        sweep=sweep_id, limit=limit, newest_first=True, before=before, with_diff=False
    )
    return [_task_out(t, scheduler) for t in tasks]


@router.post("/sweeps/{sweep_id}/cancel")
async def cancel_sweep(sweep_id: SweepId, request: Request, who: Auth) -> SweepOut:
    """Cancel every task of the sweep that has not ended. Queued ones end at once, in one
    transaction; running ones are asked to stop, and their pools confirm it shortly."""
    from broker.api.sdk import cancel_steps

    scheduler = scheduler_of(request)
    await asyncio.to_thread(_own_sweep, scheduler, sweep_id, who)
    tasks = await asyncio.to_thread(scheduler.store.tasks, sweep=sweep_id, with_diff=False)
    live = [t for t in tasks if not t.state.final]
    ended = await asyncio.to_thread(
        scheduler.store.change_states,
        [t.id for t in live if t.state in _EARLY],
        TaskState.CANCELLED,
        "cancelled by its owner (its sweep was cancelled)",
        _EARLY,
    )
    done = {t.id for t in ended}
    for task in live:
        if task.id not in done:  # in a pool: its agent stops it (and a queued one made nothing)
            await scheduler.cancel(task, wait_s=0)
            await cancel_steps(scheduler, task.id)
    scheduler.wake()
    return SweepOut(**await asyncio.to_thread(scheduler.store.sweep, sweep_id))


def _own_sweep(scheduler: Scheduler, sweep_id: int, who: Caller) -> dict[str, Any]:
    """The caller's own sweep (any for an admin); the same 404 for another's as for none."""
    try:
        sweep = scheduler.store.sweep(sweep_id)
    except NotFound:
        sweep = None
    if sweep is None or not authz.sees_owner(who, sweep["owner"]):
        raise NotFound(f"no sweep {sweep_id} of yours; `klique show ID` names a task's sweep")
    return sweep


def _create(
    scheduler: Scheduler, who: Caller, items: list[BatchItem], sweep: str | None
) -> BatchOut:
    check_batch_size(scheduler.estate, len(items), "tasks (one sweep each)")
    made = _checked(scheduler, who, items)
    team = who.team
    sweep_id, tasks = scheduler.store.create_queued(made, who.user, team, sweep)
    scheduler.wake()
    from broker.api.app import _task_out

    return BatchOut(sweep=sweep_id, tasks=[_task_out(t, scheduler) for t in tasks])


def _checked(
    scheduler: Scheduler, who: Caller, items: list[BatchItem]
) -> list[tuple[TaskSpec, float, dict[str, Any]]]:
    """Every item's spec, GPUs and parameters, or one error that names the items that fail."""
    estate = scheduler.estate
    made: list[tuple[TaskSpec, float, dict[str, Any]]] = []
    errors: list[tuple[int, str]] = []
    for index, item in enumerate(items):
        spec = spec_of(item, estate.default_resource or "")
        try:
            check_task(scheduler, who, spec)
        except HTTPException as exc:  # the diff's size
            errors.append((exc.status_code, f"tasks[{index}].code.diff: {exc.detail}"))
            continue
        except KliqueError as exc:
            status = (
                403 if isinstance(exc, NotPermitted) else 404 if isinstance(exc, NotFound) else 400
            )
            errors.append((status, f"tasks[{index}].resource: {exc}"))
            continue
        gpus = estate.resources[spec.resource].profile.gpu_share
        made.append((spec, gpus, {"parameters": item.parameters}))
    if errors:
        shown = "; ".join(text for _, text in errors[:_SHOWN_ERRORS])
        more = len(errors) - _SHOWN_ERRORS
        tail = f"; and {more} more" if more > 0 else ""
        raise HTTPException(
            errors[0][0], f"no task was made: {len(errors)} of {len(items)} fail: {shown}{tail}"
        )
    return made
