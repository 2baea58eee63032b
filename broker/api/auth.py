"""Who is asking: a user's token (the CLI, the SDK), or a task's report token (the runner, and
the SDK inside a job), which speaks for its own task and the steps that task creates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Header, HTTPException, Request

from broker.store.repository import token_digest

if TYPE_CHECKING:
    from broker.scheduler.loop import Scheduler

_REFUSED = (
    "missing or unknown token; run `klique login --token TOKEN` "
    "(the server prints where its admin token is)"
)


@dataclass(frozen=True)
class Caller:
    user: str
    admin: bool


@dataclass(frozen=True)
class Agent(Caller):
    """A caller; `task` is set when a task's report token speaks (as the task's owner)."""

    task: int | None = None


def scheduler_of(request: Request) -> Scheduler:
    scheduler: Scheduler = request.app.state.scheduler
    return scheduler


def _token(authorization: str | None) -> str:
    return (authorization or "").removeprefix("Bearer ").strip()


def caller(request: Request, authorization: Annotated[str | None, Header()] = None) -> Caller:
    token = _token(authorization)
    found = scheduler_of(request).store.user_for_token(token) if token else None
    if found is None:
        raise HTTPException(401, _REFUSED)
    return Caller(*found)


def agent(request: Request, authorization: Annotated[str | None, Header()] = None) -> Agent:
    """A user token, else a report token: the task it was made for (never another)."""
    token = _token(authorization)
    store = scheduler_of(request).store
    found = store.user_for_token(token) if token else None
    if found is not None:
        return Agent(*found)
    task = store.task_for_report_digest(token_digest(token)) if token else None
    if task is None or task.state.final:
        raise HTTPException(401, _REFUSED)
    return Agent(task.owner, False, task.id)


Auth = Annotated[Caller, Depends(caller)]
AgentAuth = Annotated[Agent, Depends(agent)]
