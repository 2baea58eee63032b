"""Every path creates a task the same way: the CLI's submit, the SDK and its pipelines, app
launches, MCP. The checks a new task passes (its compute resource, its diff's size, the team's
policy) live here once."""

from __future__ import annotations

from typing import Any

from broker.apps.launch import APPLICATION
from broker.domain import LOCAL_POOL, CodeSpec, Estate, Task, TaskSpec, TaskState
from broker.errors import NotFound, NotPermitted, TooLarge
from broker.identity.resolve import Caller
from broker.tasks.control import TaskControl
from broker.tasks.creations import Creations
from broker.tasks.schemas import SubmitRequest


def spec_of(body: SubmitRequest, default_resource: str) -> TaskSpec:
    """The task a submit body asks for (`klique submit`, an item of a batch)."""
    return TaskSpec(
        command=tuple(body.command),
        resource=body.resource or default_resource,
        name=body.name,
        project=body.project,
        env=dict(body.env),
        requirements=tuple(body.requirements),
        requirements_file=body.requirements_file,
        image=body.image,
        code=CodeSpec(**body.code.model_dump()) if body.code else None,
    )


def check_code(estate: Estate, spec: TaskSpec) -> None:
    """Refuse a diff over the estate's limit (TooLarge, with the fix)."""
    diff = len(spec.code.diff.encode()) if spec.code is not None else 0
    if diff > estate.limits.max_diff_bytes:
        raise TooLarge(
            f"the uncommitted diff is {diff} bytes, over this "
            f"server's limit of {estate.limits.max_diff_bytes}; fix: commit and push the "
            "change, ignore large files in .gitignore, or ask the platform team to raise "
            "limits.max_diff in the estate",
        )


def check_batch_size(estate: Estate, size: int, what: str) -> None:
    """Refuse a batch over the estate's `limits.max_batch` (TooLarge, with the fix)."""
    limit = estate.limits.max_batch
    if size > limit:
        raise TooLarge(
            f"{size} tasks in one request, over this server's limit of {limit}; fix: split "
            f"them into requests of at most {limit} {what}, or ask the platform team to raise "
            "limits.max_batch in the estate",
        )


def check_task(loop: TaskControl, who: Caller, spec: TaskSpec) -> str | None:
    """Refuse a task the estate would never run; returns the caller's team."""
    estate = loop.estate
    if spec.resource not in estate.resources:
        known = ", ".join(estate.resources)
        raise NotFound(
            f"unknown compute resource {spec.resource!r}; known: {known} "
            "(`klique resources` lists them)"
        )
    check_code(estate, spec)
    team = who.team
    if not estate.permitted(team, spec.resource):
        raise NotPermitted(
            f"team {team or '(none)'} may not use compute resource {spec.resource!r}; "
            "ask the platform team to add it to your team's policy"
        )
    return team


def new_task(
    loop: TaskControl,
    who: Caller,
    spec: TaskSpec,
    record: dict[str, Any] | None = None,
    app_admitted: bool = False,
) -> Task:
    """A queued task; `record` sets the SDK's fields (parent, parameters, packages, inputs).
    An app task only from broker/tasks/apps.py's `AppService.launch_task`, which has passed
    the app's rules (`app_admitted`): no other path (a clone, an import, a future one) may
    skip them."""
    if spec.kind == APPLICATION and not app_admitted:
        app = (spec.app or {}).get("name", "APP")
        raise NotPermitted(
            f"an app task is made only by an app launch (`klique app launch {app}`), which "
            "applies the app's lock, quotas, compute resources and route teams"
        )
    team = check_task(loop, who, spec)
    gpus = loop.estate.resources[spec.resource].profile.gpu_share
    store = loop.store
    if record is None:  # the short path of a batch: one INSERT of each row, no ORM objects
        task = store.create_queued([(spec, gpus, {})], who.user, team)[1][0]
    else:
        task = store.create_task(spec, who.user, team, gpus=gpus, record=record)
    loop.wake()
    return task


async def queue_task(loop: TaskControl, creations: Creations, who: Caller, spec: TaskSpec) -> Task:
    """A queued task from a single create (`POST /tasks`): the same checks, then written with
    the creates of other requests waiting at the same moment."""
    team = check_task(loop, who, spec)
    gpus = loop.estate.resources[spec.resource].profile.gpu_share
    task = await creations.create(spec, gpus, who.user, team)
    loop.wake()
    return task


def new_record(
    loop: TaskControl,
    who: Caller,
    spec: TaskSpec,
    state: TaskState,
    reason: str,
    record: dict[str, Any],
) -> Task:
    """A task no pool runs: one running where the SDK started it, or a step that reuses the
    outputs of an earlier one. It holds no capacity, but passes the same checks."""
    if spec.resource == LOCAL_POOL:
        check_code(loop.estate, spec)
        team = loop.estate.team_of(who.user)
    else:
        team = check_task(loop, who, spec)
    return loop.store.create_task(spec, who.user, team, state=state, reason=reason, record=record)
