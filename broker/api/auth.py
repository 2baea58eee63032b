"""Who is calling: the Klique token as a bearer header, checked against the store's digests."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request

from broker.domain import Task
from broker.errors import NotFound
from broker.store.repository import Store, token_digest

_NO_TASK = token_digest("")  # compared against when the id is unknown: the same work either way
UNKNOWN_CALLER = (
    "missing or unknown token; run `klique login --token TOKEN` "
    "(the server prints where its admin token is)"
)


@dataclass(frozen=True)
class Caller:
    user: str
    admin: bool


def bearer(authorization: str | None) -> str:
    return (authorization or "").removeprefix("Bearer ").strip()


def caller_of(store: Store, token: str) -> Caller | None:
    found = store.user_for_token(token) if token else None
    return Caller(*found) if found else None


def caller(request: Request, authorization: Annotated[str | None, Header()] = None) -> Caller:
    """The API's authentication dependency: 401 with the fix when the token is not known."""
    store = request.app.state.scheduler.store
    token = bearer(authorization)
    found = caller_of(store, token)
    if found is None and not token:
        found = web_caller(store, request)  # the web UI's session cookie
    if found is None:
        raise HTTPException(401, UNKNOWN_CALLER)
    return found


Auth = Annotated[Caller, Depends(caller)]


def web_caller(store: Store, request: Request) -> Caller | None:
    """The user of a signed-in browser; a state-changing request must carry its CSRF token."""
    from broker.web import session as web_session

    session = web_session.current(store, request)
    if session is None:
        return None
    if request.method not in web_session.SAFE_METHODS and not web_session.csrf_ok(
        session, request.headers.get(web_session.CSRF_HEADER)
    ):
        raise HTTPException(403, "missing or wrong X-CSRF-Token header; reload the page")
    return Caller(session.user, session.admin)


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
