"""Who is calling: the Klique token as a bearer header, checked against the store's digests;
for the SDK's endpoints, also a task's report token, which speaks for its own task (the SDK
inside a job, a pipeline's controller) and the steps that task creates."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Header, HTTPException, Request

from broker.domain import Task
from broker.errors import NotFound
from broker.store.repository import Store, token_digest

if TYPE_CHECKING:
    from broker.scheduler.loop import Scheduler

_NO_TASK = token_digest("")  # compared against when the id is unknown: the same work either way
UNKNOWN_CALLER = (
    "missing or unknown token; run `klique login --token TOKEN` "
    "(the server prints where its admin token is)"
)


@dataclass(frozen=True)
class Caller:
    user: str
    admin: bool


def scheduler_of(request: Request) -> Scheduler:
    scheduler: Scheduler = request.app.state.scheduler
    return scheduler


def bearer(authorization: str | None) -> str:
    return (authorization or "").removeprefix("Bearer ").strip()


def caller_of(store: Store, token: str) -> Caller | None:
    found = store.user_for_token(token) if token else None
    return Caller(*found) if found else None


def caller(request: Request, authorization: Annotated[str | None, Header()] = None) -> Caller:
    """The API's authentication dependency: 401 with the fix when the token is not known."""
    found = caller_of(scheduler_of(request).store, bearer(authorization))
    if found is None:
        raise HTTPException(401, UNKNOWN_CALLER)
    return found


Auth = Annotated[Caller, Depends(caller)]


@dataclass(frozen=True)
class Actor(Caller):
    """A caller; `task` is set when a task's report token speaks (as the task's owner)."""

    task: int | None = None


def actor(request: Request, authorization: Annotated[str | None, Header()] = None) -> Actor:
    """A user token, else a live task's report token: that task (never another)."""
    store = scheduler_of(request).store
    token = bearer(authorization)
    found = caller_of(store, token)
    if found is not None:
        return Actor(found.user, found.admin)
    task = store.task_for_report_digest(token_digest(token)) if token else None
    if task is None or task.state.final:
        raise HTTPException(401, UNKNOWN_CALLER)
    return Actor(task.owner, False, task.id)


ActorAuth = Annotated[Actor, Depends(actor)]


def report_token_valid(store: Store, task_id: int, token: str) -> bool:
    """Whether token is the current attempt's report token of the task. Unknown tasks and wrong
    tokens take the same work and give the same answer."""
    expected = store.report_digest(task_id) or ""
    same = hmac.compare_digest(token_digest(token), expected or _NO_TASK)
    return same and bool(expected)


def owned_task(store: Store, task_id: int, who: Caller) -> Task:
    """The caller's own task (any task for an admin); NotFound for anyone else's."""
    task = store.get(task_id)
    if task.owner != who.user and not who.admin:
        raise NotFound(f"no task {task_id} of yours; `klique ls` lists your tasks")
    return task
