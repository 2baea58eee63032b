"""The SDK's operations on tasks: tasks recorded where they run (Task.init), their parameters,
sending one to a compute resource (execute_remotely), clones, pipeline steps and cached steps.

A user's credential acts on the user's tasks (an admin's on all). A task's report token acts
on its own task, creates steps under it, and reads and cancels those steps (a pipeline
controller running as a task); it reads the artifacts its task was created to read, and
reuses only the outputs of its own pipeline run. Anything else is the NotFound of a task that
does not exist (broker/authz.py has the rules; `authz.speaks_for_task` names the token's
task)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from broker import authz
from broker.domain import LOCAL_POOL, CodeSpec, Origin, Task, TaskSpec, TaskState
from broker.errors import KliqueError, NotFound, NotPermitted, TooLarge
from broker.identity.resolve import Caller
from broker.store.identity import token_digest
from broker.store.rows import spec_json
from broker.tasks.control import TaskControl
from broker.tasks.create import check_batch_size, check_task, new_record, new_task
from broker.tasks.schemas import RunIn, TaskOut
from broker.tasks.sdk_schemas import (
    CloneIn,
    EndIn,
    RecordIn,
    RecordOut,
    RemoteIn,
    SettingsOut,
    StepOut,
    StepsIn,
)
from broker.tasks.views import task_out

Allowed = Callable[[Caller, Task], bool]


def reads(loop: TaskControl, actor: Caller, task: Task, name: str | None) -> bool:
    """A user's credential: acts_on, or a member of the task's team. A report token: its task,
    its steps, and the artifacts it was made to read (name None: a listing of a task it reads
    from)."""
    speaking = authz.speaks_for_task(actor)
    if speaking is None:
        return authz.reads_task(actor, task)
    return authz.report_token_reads(loop.store.get(speaking), task, name)


def find(loop: TaskControl, task_id: int, actor: Caller, allowed: Allowed = authz.acts_on) -> Task:
    """The task, if `allowed`; otherwise the same NotFound as a task that does not exist."""
    try:
        task = loop.store.get(task_id)
    except NotFound:
        task = None
    if task is None or not allowed(actor, task):
        raise NotFound(f"no task {task_id} of yours; `klique ls` lists your tasks")
    return task


def shown(loop: TaskControl, task: Task) -> TaskOut:
    return task_out(task, loop, detail=True)


def get_record(loop: TaskControl, actor: Caller, task_id: int) -> TaskOut:
    """A task, a pipeline's step read with the pipeline's own token, or a teammate's task."""
    return shown(loop, find(loop, task_id, actor, _reads_record))


def _reads_record(actor: Caller, task: Task) -> bool:
    return authz.controls(actor, task) or authz.reads_as_teammate(actor, task)


def settings(loop: TaskControl) -> SettingsOut:
    estate = loop.estate
    return SettingsOut(
        pipeline_resource=estate.pipeline_resource or estate.default_resource,
        default_resource=estate.default_resource,
        artifact_max_bytes=estate.artifacts.max_bytes,
    )


def record(loop: TaskControl, actor: Caller, body: RecordIn) -> RecordOut:
    """Record a task: run here (no resource), queued on a resource, or reusing outputs."""
    fields = _fields(loop, body, actor)
    if body.reuse is not None:
        return _reuse(loop, body, actor, fields)
    if body.resource is None:
        return _local(loop, body, actor, fields)
    task = new_task(loop, actor, _spec(body, body.resource, body.name, body.project), fields)
    return RecordOut(**shown(loop, task).model_dump())


def record_steps(loop: TaskControl, actor: Caller, body: StepsIn) -> list[TaskOut]:
    """Steps queued on compute resources, made together in one transaction: all, or none
    (the error names the first step that fails). A pipeline starts every ready step so."""
    check_batch_size(loop.estate, len(body.tasks), "steps")
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
            fields = _fields(loop, item, actor)
            team = check_task(loop, actor, spec)
        except KliqueError as exc:  # the same kind (404, 403, 413, 400), naming the step
            kind = type(exc) if isinstance(exc, NotFound | NotPermitted | TooLarge) else KliqueError
            raise kind(f"{where}: {exc}") from None
        made.append((spec, loop.estate.resources[spec.resource].profile.gpu_share, fields))
    _, tasks = loop.store.create_queued(made, actor.user, team)
    loop.wake()
    return [task_out(task, loop) for task in tasks]


def merge_parameters(
    loop: TaskControl, actor: Caller, task_id: int, values: dict[str, Any], overwrite: bool
) -> dict[str, Any]:
    """Record parameters; with overwrite false, the values stored on the task win (a task
    cloned with edited values runs with them, whatever the script's defaults say)."""
    task = find(loop, task_id, actor)
    return loop.store.merge_parameters(task.id, values, overwrite)


def send_remote(loop: TaskControl, actor: Caller, task_id: int, body: RemoteIn) -> TaskOut:
    """A task running locally becomes the same task queued on a compute resource."""
    task = _local_task(loop, task_id, actor)
    resource = body.resource or loop.estate.default_resource or ""
    spec = _spec(RunIn(**body.model_dump()), resource, task.spec.name, task.spec.project)
    check_task(loop, actor, spec)
    stored, diff = spec_json(spec)
    moved = loop.store.change_state(
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
        gpus=loop.estate.resources[resource].profile.gpu_share,
        report_digest="",
    )
    if moved is None:
        raise KliqueError(f"task {task.id} is no longer running; it cannot be sent")
    loop.wake()
    return shown(loop, moved)


def end(loop: TaskControl, actor: Caller, task_id: int, body: EndIn) -> TaskOut:
    """A local run ends by its own word: no pool capacity was involved (SECURITY.md 7)."""
    task = _local_task(loop, task_id, actor)
    state = TaskState.COMPLETED if body.outcome == "completed" else TaskState.FAILED
    reason = body.reason or ("completed" if body.exit_code in (0, None) else "failed")
    ended = loop.store.change_state(
        task.id, state, reason, only_from=[TaskState.RUNNING], exit_code=body.exit_code
    )
    return shown(loop, ended or loop.store.get(task.id))


def clone(loop: TaskControl, actor: Caller, task: Task, body: CloneIn) -> TaskOut:
    """A new queued task with the same code, packages and parameters (edited). An app task
    is the adapters' to relaunch, through every rule of an app launch."""
    if task.origin is Origin.LOCAL and task.spec.resource == LOCAL_POOL and not body.resource:
        raise KliqueError(f"task {task.id} ran locally; give the compute resource to run it on")
    resource = body.resource or task.spec.resource
    spec = replace(task.spec, resource=resource, name=body.name or task.spec.name)
    fields = {
        "parameters": {**task.parameters, **body.parameters},
        "packages": list(task.packages),
        "parent_id": _clone_parent(loop, actor, body.parent),
    }
    return shown(loop, new_task(loop, actor, spec, fields))


def _clone_parent(loop: TaskControl, actor: Caller, asked: int | None) -> int | None:
    """The pipeline a clone is a step of: a report token's own task (it makes its own steps
    only), or the task asked for if the caller acts on it (ClearML's add_step)."""
    speaking = authz.speaks_for_task(actor)
    if asked is None or asked == speaking:
        return speaking
    return find(loop, asked, actor).id


def steps(loop: TaskControl, actor: Caller, task_id: int) -> list[StepOut]:
    """A pipeline's steps, each with the steps whose outputs it reads."""
    pipeline = find(loop, task_id, actor, authz.controls)
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
        for s in loop.store.children(pipeline.id)
    ]


async def cancel(loop: TaskControl, actor: Caller, task_id: int) -> TaskOut:
    """Cancel a task, or a pipeline's step with the pipeline's own token."""
    task = find(loop, task_id, actor, authz.controls)
    if not task.state.final:
        task = await loop.cancel(task)
    return shown(loop, task)


def cached(loop: TaskControl, actor: Caller, key: str) -> TaskOut:
    """The newest completed task of the caller with this cache key (same code and inputs);
    for a report token, the newest such step of its own pipeline run (reuse allows no other)."""
    speaking = authz.speaks_for_task(actor)
    if speaking is None:
        task = loop.store.cached(actor.user, key)
    else:
        task = _cached_step(loop, speaking, key)
    if task is None:
        raise NotFound("no completed task with this code and these inputs")
    return shown(loop, task)


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


def _fields(loop: TaskControl, body: RecordIn, actor: Caller) -> dict[str, Any]:
    """The SDK's fields of a new record, its parent and inputs checked: the caller's own."""
    parent = _parent(loop, body.parent, actor)
    for ref in body.inputs:
        source = find(loop, ref.task, actor, authz.controls)
        if loop.store.artifact(source.id, ref.name) is None:
            raise NotFound(f"task {ref.task} has no artifact {ref.name!r}")
    return {
        "parent_id": parent,
        "parameters": body.parameters,
        "packages": list(body.packages),
        "inputs": [[ref.task, ref.name] for ref in body.inputs],
        "cache_key": body.cache_key,
        "tags": sorted(set(body.tags)),
    }


def _parent(loop: TaskControl, parent: int | None, actor: Caller) -> int | None:
    """A report token's tasks are its own task's steps; a user's, under one of the user's."""
    speaking = authz.speaks_for_task(actor)
    if speaking is not None:
        if parent not in (None, speaking):  # another task of its owner: none of its business
            raise authz.no_such_task(parent)
        return speaking
    if parent is not None:
        find(loop, parent, actor)
    return parent


def _local(loop: TaskControl, body: RecordIn, actor: Caller, fields: dict[str, Any]) -> RecordOut:
    """A run outside any pool, recorded RUNNING as it starts and metered on `(local)`."""
    if authz.speaks_for_task(actor) is not None:
        raise NotPermitted(
            "a task inside a Klique job is already recorded; Task.init attaches to it"
        )
    spec = _spec(body, LOCAL_POOL, body.name, body.project)
    token = secrets.token_urlsafe(32)
    fields.update(origin=Origin.LOCAL.value, pool=LOCAL_POOL, report_digest=token_digest(token))
    task = new_record(
        loop,
        actor,
        spec,
        TaskState.RUNNING,
        "running where it was started (recorded by the SDK)",
        fields,
    )
    return RecordOut(**shown(loop, task).model_dump(), report_token=token)


def _reuse(loop: TaskControl, body: RecordIn, actor: Caller, fields: dict[str, Any]) -> RecordOut:
    """A step whose code and inputs match a completed one: its outputs, without running."""
    assert body.reuse is not None
    speaking = authz.speaks_for_task(actor)
    own = None if speaking is None else loop.store.get(speaking)
    earlier = find(loop, body.reuse, actor, lambda a, t: authz.may_reuse(a, t, own))
    if earlier.state is not TaskState.COMPLETED:
        raise KliqueError(f"task {earlier.id} is {earlier.state.value}; only completed ones reuse")
    spec = _spec(body, body.resource or earlier.resource, body.name, body.project)
    fields.update(origin=Origin.CACHED.value, pool=earlier.pool)
    task = new_record(
        loop,
        actor,
        spec,
        TaskState.COMPLETED,
        f"reused the outputs of task {earlier.id} (same code and inputs)",
        fields,
    )
    loop.store.copy_artifacts(earlier.id, task.id)
    return RecordOut(**shown(loop, task).model_dump())


def _local_task(loop: TaskControl, task_id: int, actor: Caller) -> Task:
    if authz.speaks_for_task(actor) is not None:
        raise NotPermitted("only the owner's own token can send or end a local run")
    task = find(loop, task_id, actor)
    if task.origin is not Origin.LOCAL:
        raise KliqueError(
            f"task {task.id} runs in pool {task.pool or '(none yet)'}; only a task that runs "
            "locally (recorded by Task.init) can be sent or ended this way"
        )
    return task


def _cached_step(loop: TaskControl, pipeline: int, key: str) -> Task | None:
    done = [
        s
        for s in loop.store.children(pipeline)
        if s.cache_key == key and s.state is TaskState.COMPLETED
    ]
    return done[-1] if done else None
