"""Every path creates a task the same way: the CLI's submit, app launches, MCP. The checks a
new task passes (its compute resource, its diff's size, the team's policy) live here once."""

from __future__ import annotations

from fastapi import HTTPException

from broker.api.auth import Caller
from broker.domain import Task, TaskSpec
from broker.errors import NotFound, NotPermitted
from broker.scheduler.loop import Scheduler


def check_task(scheduler: Scheduler, who: Caller, spec: TaskSpec) -> str | None:
    """Refuse a task the estate would never run; returns the caller's team."""
    estate = scheduler.estate
    if spec.resource not in estate.resources:
        known = ", ".join(estate.resources)
        raise NotFound(
            f"unknown compute resource {spec.resource!r}; known: {known} "
            "(`klique resources` lists them)"
        )
    diff = len(spec.code.diff.encode()) if spec.code is not None else 0
    if diff > estate.limits.max_diff_bytes:
        raise HTTPException(
            413,
            f"the uncommitted diff is {diff} bytes, over this "
            f"server's limit of {estate.limits.max_diff_bytes}; fix: commit and push the "
            "change, ignore large files in .gitignore, or ask the platform team to raise "
            "limits.max_diff in the estate",
        )
    team = who.team
    if not estate.permitted(team, spec.resource):
        raise NotPermitted(
            f"team {team or '(none)'} may not use compute resource {spec.resource!r}; "
            "ask the platform team to add it to your team's policy"
        )
    return team


def new_task(scheduler: Scheduler, who: Caller, spec: TaskSpec) -> Task:
    team = check_task(scheduler, who, spec)
    profile = scheduler.estate.resources[spec.resource].profile
    task = scheduler.store.create_task(spec, who.user, team, gpus=profile.gpu_share)
    scheduler.wake()
    return task
