"""The checks every new task passes, however it is made (`klique submit`, the SDK, a
pipeline step): a known compute resource the team may use, and a diff within the limit."""

from __future__ import annotations

from fastapi import HTTPException

from broker.domain import CodeSpec, Estate
from broker.errors import NotFound, NotPermitted


def admit(estate: Estate, resource: str | None, code: CodeSpec | None, user: str) -> str:
    """The compute resource the task goes to; 404, 413 or 403 with the fix otherwise."""
    resource = resource or estate.default_resource or ""
    if resource not in estate.resources:
        known = ", ".join(estate.resources)
        raise NotFound(
            f"unknown compute resource {resource!r}; known: {known} (`klique resources` lists them)"
        )
    diff_bytes = len(code.diff.encode()) if code is not None else 0
    if diff_bytes > estate.limits.max_diff_bytes:
        raise HTTPException(
            413,
            f"the uncommitted diff is {diff_bytes} bytes, over this "
            f"server's limit of {estate.limits.max_diff_bytes}; fix: commit and push the "
            "change, ignore large files in .gitignore, or ask the platform team to raise "
            "limits.max_diff in the estate",
        )
    team = estate.team_of(user)
    if not estate.permitted(team, resource):
        raise NotPermitted(
            f"team {team or '(none)'} may not use compute resource {resource!r}; "
            "ask the platform team to add it to your team's policy"
        )
    return resource
