"""The SDK's endpoints: tasks recorded where they run (Task.init), their parameters, sending
one to a compute resource (execute_remotely), clones, pipeline steps and cached steps.

A user's token acts on the user's tasks (an admin's on all). A task's report token acts on
its own task, creates steps under it, and reads and cancels those steps (a pipeline
controller running as a task); it reads the artifacts its task was created to read, and
reuses only the outputs of its own pipeline run. Anything else is the 404 of a task that
does not exist (broker/authz.py has the rules)."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi import Path as PathParam

from broker import authz
from broker.api.apps import relaunch_task
from broker.api.auth import Actor, ActorAuth, scheduler_of
from broker.api.create import check_batch_size, check_task, new_record, new_task
from broker.api.schemas import RunIn, TaskOut
from broker.api.sdk_schemas import (
    CloneIn,
    EndIn,
    ParametersIn,
    ParametersOut,
    RecordIn,
    RecordOut,
    RemoteIn,
    SettingsOut,
    StepOut,
    StepsIn,
)
from broker.apps.launch import APPLICATION
from broker.domain import LOCAL_POOL, CodeSpec, Origin, Task, TaskSpec, TaskState
from broker.errors import KliqueError, NotFound, NotPermitted
from broker.scheduler.loop import Scheduler
from broker.store.repository import token_digest

router = APIRouter(prefix="/api/v1")
TaskId = Annotated[int, PathParam(ge=1, lt=2**63, description="A task's id.")]


def acts_on(actor: Actor, task: Task) -> bool:
    """The task's owner (or an admin) with a user token, or the task's own report token."""
    return authz.acts_on(actor, task)


def controls(actor: Actor, task: Task) -> bool:
    """acts_on, or a pipeline's report token over its steps."""
    return authz.controls(actor, task)


def reads(scheduler: Scheduler, actor: Actor, task: Task, name: str | None) -> bool:
    """A user's token: acts_on. A report token: its task, its steps, and the artifacts it was
    made to read (name None: a listing of a task it reads from)."""
    if actor.task is None:
        return acts_on(actor, task)
    return authz.report_token_reads(scheduler.store.get(actor.task), task, name)


def find(scheduler: Scheduler, task_id: int, actor: Actor, allowed: Any = acts_on) -> Task:
    """The task, if `allowed`; otherwise the same 404 as a task that does not exist."""
    try:
        task = scheduler.store.get(task_id)
    except NotFound:
        task = None
    if task is None or not allowed(actor, task):
        raise NotFound(f"no task {task_id} of yours; `klique ls` lists your tasks")
    return task


def _out(task: Task, scheduler: Scheduler) -> TaskOut:
    from broker.api.app import _task_out

    return _task_out(task, scheduler, detail=True)


def _spec(body: RunIn, resource: str, name: str, project: str) -> TaskSpec:
    return TaskSpec(
        command=tuple(body.command),
        resource=resource,
        name=name,
        project=project,
        env=dict(body.env),
        code=CodeSpec(**body.code.model_dump()) if body.code else None,
        requirements=tuple(body.requirements),
        requirements_file=body.requirements_file,
        image=body.image,
    )


@router.get("/sdk/settings")
def settings(request: Request, actor: ActorAuth) -> SettingsOut:
    estate = scheduler_of(request).estate
    return SettingsOut(
        pipeline_resource=estate.pipeline_resource or estate.default_resource,
        default_resource=estate.default_resource,
        artifact_max_bytes=estate.artifacts.max_bytes,
    )


@router.post("/sdk/tasks", status_code=201)
def record(body: RecordIn, request: Request, actor: ActorAuth) -> RecordOut:
    """Record a task: run here (no resource), queued on a resource, or reusing outputs."""
    scheduler = scheduler_of(request)
    fields = _fields(scheduler, body, actor)
    if body.reuse is not None:
        return _reuse(scheduler, body, actor, fields)
    if body.resource is None:
        return _local(scheduler, body, actor, fields)
    task = new_task(scheduler, actor, _spec(body, body.resource, body.name, body.project), fields)
    return RecordOut(**_out(task, scheduler).model_dump())


@router.post("/sdk/tasks/batch", status_code=201)
def record_steps(body: StepsIn, request: Request, actor: ActorAuth) -> list[TaskOut]:
    """Steps queued on compute resources, made together in one transaction: all, or none
    (the error names the first step that fails). A pipeline starts every ready step so."""
    scheduler = scheduler_of(request)
    check_batch_size(scheduler.estate, len(body.tasks), "steps")
    made: list[tuple[TaskSpec, float, dict[str, Any]]] = []
    team = None
    for index, item in enumerate(body.tasks):
        where = f"no step was made: tasks[{index}]"
        if item.resource is None or item.reuse is not None:
            raise KliqueError(
                f"{where} runs locally or reuses outputs; fix: record such a step alone "
                "(POST /sdk/tasks)"
            )
        spec = _spec(item, item.resource, item.name, item.project)
        try:
            fields = _fields(scheduler, item, actor)
            team = check_task(scheduler, actor, spec)
        except HTTPException as exc:  # the diff's size
            raise HTTPException(exc.status_code, f"{where}: {exc.detail}") from None
        except KliqueError as exc:  # the same status (404, 403, 400), naming the step
            kind = type(exc) if isinstance(exc, NotFound | NotPermitted) else KliqueError
            raise kind(f"{where}: {exc}") from None
        made.append((spec, scheduler.estate.resources[spec.resource].profile.gpu_share, fields))
    _, tasks = scheduler.store.create_queued(made, actor.user, team)
    scheduler.wake()
    from broker.api.app import _task_out

    return [_task_out(task, scheduler) for task in tasks]


def _fields(scheduler: Scheduler, body: RecordIn, actor: Actor) -> dict[str, Any]:
    """The SDK's fields of a new record, its parent and inputs checked: the caller's own."""
    parent = _parent(scheduler, body.parent, actor)
    for ref in body.inputs:
        if (
            scheduler.store.artifact(find(scheduler, ref.task, actor, controls).id, ref.name)
            is None
        ):
            raise NotFound(f"task {ref.task} has no artifact {ref.name!r}")
    return {
        "parent_id": parent,
        "parameters": body.parameters,
        "packages": list(body.packages),
        "inputs": [[ref.task, ref.name] for ref in body.inputs],
        "cache_key": body.cache_key,
    }


def _parent(scheduler: Scheduler, parent: int | None, actor: Actor) -> int | None:
    """A report token's tasks are its own task's steps; a user's, under one of the user's."""
    if actor.task is not None:
        if parent not in (None, actor.task):  # another task of its owner: none of its business
            raise authz.no_such_task(parent)
        return actor.task
    if parent is not None:
        find(scheduler, parent, actor)
    return parent


def _local(scheduler: Scheduler, body: RecordIn, actor: Actor, fields: dict[str, Any]) -> RecordOut:
    """A run outside any pool, recorded RUNNING as it starts and metered on `(local)`."""
    if actor.task is not None:
        raise NotPermitted(
            "a task inside a Klique job is already recorded; Task.init attaches to it"
        )
    spec = _spec(body, LOCAL_POOL, body.name, body.project)
    token = secrets.token_urlsafe(32)
    fields.update(origin=Origin.LOCAL.value, pool=LOCAL_POOL, report_digest=token_digest(token))
    task = new_record(
        scheduler,
        actor,
        spec,
        TaskState.RUNNING,
        "running where it was started (recorded by the SDK)",
        fields,
    )
    return RecordOut(**_out(task, scheduler).model_dump(), report_token=token)


def _reuse(scheduler: Scheduler, body: RecordIn, actor: Actor, fields: dict[str, Any]) -> RecordOut:
    """A step whose code and inputs match a completed one: its outputs, without running."""
    assert body.reuse is not None
    own = None if actor.task is None else scheduler.store.get(actor.task)
    earlier = find(scheduler, body.reuse, actor, lambda a, t: authz.may_reuse(a, t, own))
    if earlier.state is not TaskState.COMPLETED:
        raise KliqueError(f"task {earlier.id} is {earlier.state.value}; only completed ones reuse")
    spec = _spec(body, body.resource or earlier.resource, body.name, body.project)
    fields.update(origin=Origin.CACHED.value, pool=earlier.pool)
    task = new_record(
        scheduler,
        actor,
        spec,
        TaskState.COMPLETED,
        f"reused the outputs of task {earlier.id} (same code and inputs)",
        fields,
    )
    scheduler.store.copy_artifacts(earlier.id, task.id)
    return RecordOut(**_out(task, scheduler).model_dump())


@router.get("/sdk/tasks/{task_id}")
def get_record(task_id: TaskId, request: Request, actor: ActorAuth) -> TaskOut:
    scheduler = scheduler_of(request)
    return _out(find(scheduler, task_id, actor, controls), scheduler)


@router.post("/sdk/tasks/{task_id}/parameters")
def parameters(
    task_id: TaskId, body: ParametersIn, request: Request, actor: ActorAuth
) -> ParametersOut:
    """Record parameters; with overwrite false, the values stored on the task win (a task
    cloned with edited values runs with them, whatever the script's defaults say)."""
    scheduler = scheduler_of(request)
    task = find(scheduler, task_id, actor)
    merged = scheduler.store.merge_parameters(task.id, body.values, body.overwrite)
    return ParametersOut(parameters=merged)


@router.post("/sdk/tasks/{task_id}/remote")
def execute_remotely(
    task_id: TaskId, body: RemoteIn, request: Request, actor: ActorAuth
) -> TaskOut:
    """A task running locally becomes the same task queued on a compute resource."""
    scheduler = scheduler_of(request)
    task = _local_task(scheduler, task_id, actor)
    resource = body.resource or scheduler.estate.default_resource or ""
    spec = _spec(RunIn(**body.model_dump()), resource, task.spec.name, task.spec.project)
    check_task(scheduler, actor, spec)
    from broker.store.repository import _spec_json

    stored, diff = _spec_json(spec)
    moved = scheduler.store.change_state(
        task.id,
        TaskState.QUEUED,
        f"sent from where it ran to {resource}",
        only_from=[TaskState.RUNNING],
        origin=Origin.POOL.value,
        pool=None,
        resource=resource,
        spec=stored,
        diff=diff,
        diff_bytes=len(diff.encode()),
        gpus=scheduler.estate.resources[resource].profile.gpu_share,
        report_digest="",
    )
    if moved is None:
        raise KliqueError(f"task {task.id} is no longer running; it cannot be sent")
    scheduler.wake()
    return _out(moved, scheduler)


@router.post("/sdk/tasks/{task_id}/end")
def end(task_id: TaskId, body: EndIn, request: Request, actor: ActorAuth) -> TaskOut:
    """A local run ends by its own word: no pool capacity was involved (SECURITY.md 7)."""
    scheduler = scheduler_of(request)
    task = _local_task(scheduler, task_id, actor)
    state = TaskState.COMPLETED if body.outcome == "completed" else TaskState.FAILED
    reason = body.reason or ("completed" if body.exit_code in (0, None) else "failed")
    ended = scheduler.store.change_state(
        task.id, state, reason, only_from=[TaskState.RUNNING], exit_code=body.exit_code
    )
    return _out(ended or scheduler.store.get(task.id), scheduler)


def _local_task(scheduler: Scheduler, task_id: int, actor: Actor) -> Task:
    if actor.task is not None:
        raise NotPermitted("only the owner's own token can send or end a local run")
    task = find(scheduler, task_id, actor)
    if task.origin is not Origin.LOCAL:
        raise KliqueError(
            f"task {task.id} runs in pool {task.pool or '(none yet)'}; only a task that runs "
            "locally (recorded by Task.init) can be sent or ended this way"
        )
    return task


@router.post("/sdk/tasks/{task_id}/clone", status_code=201)
def clone(task_id: TaskId, body: CloneIn, request: Request, actor: ActorAuth) -> TaskOut:
    """A new queued task with the same code, packages and parameters (edited)."""
    scheduler = scheduler_of(request)
    task = find(scheduler, task_id, actor)
    if task.spec.kind == APPLICATION:  # an app again: through every rule of a launch
        hub = request.app.state.route_hub
        return _out(relaunch_task(scheduler, actor, task, hub, body.resource, body.name), scheduler)
    if task.origin is Origin.LOCAL and task.spec.resource == LOCAL_POOL and not body.resource:
        raise KliqueError(f"task {task.id} ran locally; give the compute resource to run it on")
    resource = body.resource or task.spec.resource
    spec = replace(task.spec, resource=resource, name=body.name or task.spec.name)
    fields = {
        "parameters": {**task.parameters, **body.parameters},
        "packages": list(task.packages),
        "parent_id": actor.task,  # a report token makes steps of its own task only
    }
    return _out(new_task(scheduler, actor, spec, fields), scheduler)


@router.get("/sdk/tasks/{task_id}/steps")
def steps(task_id: TaskId, request: Request, actor: ActorAuth) -> list[StepOut]:
    """A pipeline's steps, each with the steps whose outputs it reads."""
    scheduler = scheduler_of(request)
    pipeline = find(scheduler, task_id, actor, controls)
    return [
        StepOut(
            id=s.id,
            name=s.spec.name,
            state=s.state.value,
            reason=s.reason,
            resource=s.spec.resource,
            pool=s.pool,
            origin=s.origin.value,
            exit_code=s.exit_code,
            needs=sorted({t for t, _ in s.inputs}),
        )
        for s in scheduler.store.children(pipeline.id)
    ]


@router.post("/sdk/tasks/{task_id}/cancel")
async def cancel(task_id: TaskId, request: Request, actor: ActorAuth) -> TaskOut:
    """Cancel a task, or a pipeline's step with the pipeline's own token."""
    scheduler = scheduler_of(request)
    task = find(scheduler, task_id, actor, controls)
    if not task.state.final:
        task = await scheduler.cancel(task)
    return _out(task, scheduler)


@router.get("/sdk/cached")
def cached(
    request: Request,
    actor: ActorAuth,
    key: Annotated[str, Query(pattern=r"^[0-9a-f]{64}$")],
) -> TaskOut:
    """The newest completed task of the caller with this cache key (same code and inputs);
    for a report token, the newest such step of its own pipeline run (reuse allows no other)."""
    scheduler = scheduler_of(request)
    if actor.task is None:
        task = scheduler.store.cached(actor.user, key)
    else:
        task = _cached_step(scheduler, actor.task, key)
    if task is None:
        raise NotFound("no completed task with this code and these inputs")
    return _out(task, scheduler)


def _cached_step(scheduler: Scheduler, pipeline: int, key: str) -> Task | None:
    steps = scheduler.store.children(pipeline)
    done = [s for s in steps if s.cache_key == key and s.state is TaskState.COMPLETED]
    return done[-1] if done else None


async def cancel_steps(scheduler: Scheduler, parent: int) -> None:
    """Cancelling a task cancels the tasks it made (a pipeline's steps) that have not ended."""
    steps = await asyncio.to_thread(scheduler.store.children, parent)
    await asyncio.gather(*(scheduler.cancel(s) for s in steps if not s.state.final))
