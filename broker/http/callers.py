"""Who is calling, one way for every adapter (the API, the route proxy, MCP; the web UI's pages
read the same sessions through broker/web/session.py): a Klique token or a single sign-on
access token (`Authorization: Bearer ...`), or a browser session cookie (with its CSRF header for
requests that change something). A token's scopes decide what it may do: `read` for requests
that only look, `submit` for the others. For the SDK's endpoints, also a task's report token,
which speaks for its own task (the SDK inside a job, a pipeline's controller) and the steps that
task creates. Also here: the caller's own task."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, fields
from typing import Annotated

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from broker.authz import Action, find_task, needed_scope, report_refusal, scope_problem
from broker.control.loop import ControlLoop
from broker.domain import Task
from broker.http.cookies import CSRF_HEADER, SESSION_COOKIE
from broker.identity.resolve import Caller, Identities, Refused
from broker.store.identity import token_digest
from broker.store.repository import Store

__all__ = [
    "Actor",
    "ActorAuth",
    "Auth",
    "Caller",
    "bearer",
    "caller",
    "caller_of",
    "control_of",
    "needed_scope",
    "owned_task",
    "report_token_valid",
    "reporting_task",
    "scope_problem",
]

SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
_NO_TASK = token_digest("")  # compared against when the id is unknown: the same work either way
UNKNOWN_CALLER = (
    "missing or unknown token; run `klique login --token TOKEN` (the server prints where its "
    "admin token is), or `klique login --sso` where single sign-on is set up"
)


def control_of(request: Request) -> ControlLoop:
    control: ControlLoop = request.app.state.control
    return control


def bearer(authorization: str | None) -> str:
    return (authorization or "").removeprefix("Bearer ").strip()


def identities_of(app: FastAPI) -> Identities:
    identities: Identities = app.state.identities
    return identities


def from_bearer(identities: Identities, token: str) -> Caller:
    """The caller a bearer token names; Refused when it names none."""
    if not token:
        raise Refused(401, UNKNOWN_CALLER)
    # Klique's tokens are URL-safe base64 without dots; a JWT has two.
    if token.count(".") == 2:
        return identities.from_access_token(token)
    return identities.from_token(token)


def caller_of(identities: Identities, token: str) -> Caller | None:
    """The caller a bearer token names, or None (routes and MCP say "who are you?" their way)."""
    try:
        return from_bearer(identities, token)
    except Refused:
        return None


async def caller(request: Request, authorization: Annotated[str | None, Header()] = None) -> Caller:
    """The API's authentication dependency: 401 with the fix when the caller is not known,
    403 when their token's scopes do not allow the request. A token read in the last few
    seconds is answered on the event loop; anything else is read in a worker thread."""
    who = identities_of(request.app).remembered(bearer(authorization))
    if who is None:
        return await run_in_threadpool(checked_caller, request, authorization)
    return _scoped(who, request.method)


def checked_caller(request: Request, authorization: str | None) -> Caller:
    """`caller`, reading the store where it must (in a worker thread)."""
    try:
        who = _resolve(identities_of(request.app), request, authorization)
    except Refused as exc:
        raise HTTPException(exc.status, str(exc)) from None
    return _scoped(who, request.method)


def _scoped(who: Caller, method: str) -> Caller:
    problem = scope_problem(who, needed_scope(method))
    if problem:
        raise HTTPException(403, problem)
    return who


def _resolve(identities: Identities, request: Request, authorization: str | None) -> Caller:
    token = bearer(authorization)
    if token:
        return from_bearer(identities, token)
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        unsafe = request.method not in SAFE
        return identities.from_session(cookie, unsafe, request.headers.get(CSRF_HEADER))
    raise Refused(401, UNKNOWN_CALLER)


Auth = Annotated[Caller, Depends(caller)]


@dataclass(frozen=True)
class Actor(Caller):
    """A caller; `task` is set when a task's report token speaks (as the task's owner)."""

    task: int | None = None


def actor(request: Request, authorization: Annotated[str | None, Header()] = None) -> Actor:
    """A live task's report token: that task (never another; what it may do there is
    broker/authz.py's); 409 once the task has ended; else a user's credential as `caller`
    checks it, scopes included. A requeued or superseded attempt's token is no task's."""
    token = bearer(authorization)
    task = None
    if token and token.count(".") != 2:  # a report token is never a JWT
        store = control_of(request).store
        task = store.task_for_report_digest(token_digest(token))
    if task is not None:
        refusal = report_refusal(task)
        if refusal:
            raise HTTPException(409, refusal)
        return Actor(task.owner, False, team=task.team, task=task.id)
    who = checked_caller(request, authorization)
    return Actor(**{f.name: getattr(who, f.name) for f in fields(who)})


ActorAuth = Annotated[Actor, Depends(actor)]


def report_token_valid(store: Store, task_id: int, token: str) -> bool:
    """Whether token is the current attempt's report token of the task. Unknown tasks and wrong
    tokens take the same work and give the same answer."""
    return _same_token(token, store.report_digest(task_id) or "")


def reporting_task(store: Store, task_id: int, token: str) -> Task | None:
    """The task whose current attempt's report token this is, read once; None for an unknown
    task or another token, alike (report_token_valid)."""
    return store.reported(task_id, lambda expected: _same_token(token, expected))


def _same_token(token: str, expected: str) -> bool:
    same = hmac.compare_digest(token_digest(token), expected or _NO_TASK)
    return same and bool(expected)


def owned_task(store: Store, task_id: int, who: Caller, action: Action = Action.READ_TASK) -> Task:
    """The caller's own task (any task for an admin), if authz lets them do `action` to it;
    NotFound for anyone else's."""
    return find_task(store.get, who, action, task_id)
