"""Many tasks in one request: a batch or a sweep, whose tasks share one sweep id to be listed
and cancelled together.

Every item passes the same checks as one `klique submit` (broker/tasks/create.py); all items
are checked before any is made, and all are made in one transaction: all or none. An item's
error names its index and field. The estate's `limits.max_batch` bounds the items of one
request."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, Field

from broker import authz
from broker.domain import TaskSpec, TaskState
from broker.errors import KliqueError, TooLarge
from broker.identity.resolve import Caller
from broker.names import LINE
from broker.tasks.cancelling import cancel_steps
from broker.tasks.control import TaskControl
from broker.tasks.create import check_batch_size, check_task, spec_of
from broker.tasks.schemas import SubmitRequest, TaskOut, _Body
from broker.tasks.sdk_schemas import Parameters
from broker.tasks.views import task_out

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


def create_many(
    loop: TaskControl, who: Caller, items: list[BatchItem], sweep: str | None
) -> BatchOut:
    """Every item made in one transaction, as a sweep named `sweep` (None: a batch)."""
    check_batch_size(loop.estate, len(items), "tasks (one sweep each)")
    made = _checked(loop, who, items)
    sweep_id, tasks = loop.store.create_queued(made, who.user, who.team, sweep)
    loop.wake()
    return BatchOut(sweep=sweep_id, tasks=[task_out(t, loop) for t in tasks])


def own_sweep(loop: TaskControl, sweep_id: int, who: Caller) -> dict[str, Any]:
    """The caller's own sweep (any for an admin); the same NotFound for another's as for
    none."""
    refusal = f"no sweep {sweep_id} of yours; `klique show ID` names a task's sweep"
    return authz.find_owned(who, lambda: loop.store.sweep(sweep_id), refusal)


def sweep_tasks(
    loop: TaskControl, who: Caller, sweep_id: int, limit: int, before: int | None
) -> list[TaskOut]:
    """The sweep's tasks, newest first, a page at a time: pass the last id seen as `before`."""
    own_sweep(loop, sweep_id, who)
    tasks = loop.store.tasks(
        sweep=sweep_id, limit=limit, newest_first=True, before=before, with_diff=False
    )
    return [task_out(t, loop) for t in tasks]


async def cancel_sweep(loop: TaskControl, who: Caller, sweep_id: int) -> SweepOut:
    """Cancel every task of the sweep that has not ended. Queued ones end at once, in one
    transaction; running ones are asked to stop, and their pools confirm it shortly."""
    await asyncio.to_thread(own_sweep, loop, sweep_id, who)
    tasks = await asyncio.to_thread(loop.store.tasks, sweep=sweep_id, with_diff=False)
    live = [t for t in tasks if not t.state.final]
    ended = await asyncio.to_thread(
        loop.store.change_states,
        [t.id for t in live if t.state in _EARLY],
        TaskState.CANCELLED,
        "cancelled by its owner (its sweep was cancelled)",
        _EARLY,
    )
    done = {t.id for t in ended}
    for task in live:
        if task.id not in done:  # in a pool: its agent stops it (and a queued one made nothing)
            await loop.cancel(task, wait_s=0)
            await cancel_steps(loop, task.id)
    loop.wake()
    return SweepOut(**await asyncio.to_thread(loop.store.sweep, sweep_id))


def _checked(
    loop: TaskControl, who: Caller, items: list[BatchItem]
) -> list[tuple[TaskSpec, float, dict[str, Any]]]:
    """Every item's spec, GPUs and parameters, or one error, of the first failing item's
    kind, that names the items that fail."""
    estate = loop.estate
    made: list[tuple[TaskSpec, float, dict[str, Any]]] = []
    errors: list[tuple[type[KliqueError], str]] = []
    for index, item in enumerate(items):
        spec = spec_of(item, estate.default_resource or "")
        try:
            check_task(loop, who, spec)
        except KliqueError as exc:
            field = "code.diff" if isinstance(exc, TooLarge) else "resource"
            errors.append((type(exc), f"tasks[{index}].{field}: {exc}"))
            continue
        gpus = estate.resources[spec.resource].profile.gpu_share
        made.append((spec, gpus, {"parameters": item.parameters}))
    if errors:
        shown = "; ".join(text for _, text in errors[:_SHOWN_ERRORS])
        more = len(errors) - _SHOWN_ERRORS
        tail = f"; and {more} more" if more > 0 else ""
        kind = errors[0][0]
        raise kind(f"no task was made: {len(errors)} of {len(items)} fail: {shown}{tail}")
    return made
