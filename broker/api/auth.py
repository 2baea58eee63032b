"""The one authentication dependency every route uses: a Klique token or a single sign-on
access token (`Authorization: Bearer ...`), or a browser session cookie (with its CSRF header
for requests that change something). Read-only tokens may only read. Also the checks every
path shares: report tokens, and whose task a task is."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request

from broker.domain import Task
from broker.errors import NotFound
from broker.identity.resolve import Caller, Identities, Refused
from broker.store.repository import Store, token_digest

__all__ = ["Auth", "Caller", "caller", "caller_of", "owned_task", "report_token_valid"]

SESSION_COOKIE = "klique_session"
CSRF_COOKIE = "klique_csrf"
CSRF_HEADER = "X-Klique-CSRF"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_NO_TASK = token_digest("")  # compared against when the id is unknown: the same work either way


def bearer(authorization: str | None) -> str:
    return (authorization or "").removeprefix("Bearer ").strip()


def identities_of(request: Request) -> Identities:
    identities: Identities = request.app.state.identities
    return identities


def caller(request: Request, authorization: Annotated[str | None, Header()] = None) -> Caller:
    """The API's authentication dependency: 401 or 403 with the reason and the fix."""
    try:
        who = _resolve(identities_of(request), request, authorization)
    except Refused as exc:
        raise HTTPException(exc.status, str(exc)) from None
    needed = "read" if request.method in SAFE_METHODS else "submit"
    if needed not in who.scopes:
        raise HTTPException(
            403,
            f"this token may only {' and '.join(sorted(who.scopes))}; this request needs "
            f"the {needed!r} scope (ask for a token with --scope {needed})",
        )
    return who


Auth = Annotated[Caller, Depends(caller)]


def _resolve(identities: Identities, request: Request, authorization: str | None) -> Caller:
    token = bearer(authorization)
    if token:
        return caller_of(identities, token)
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        unsafe = request.method not in SAFE_METHODS
        return identities.from_session(cookie, unsafe, request.headers.get(CSRF_HEADER))
    raise Refused(
        401,
        "missing or unknown token; run `klique login --token TOKEN` (the server prints where "
        "its admin token is), or `klique login --sso` where single sign-on is set up",
    )


def caller_of(identities: Identities, token: str) -> Caller:
    """Who a bearer token is: a Klique token, or a single sign-on access token (a JWT)."""
    # Klique's tokens are URL-safe base64 without dots; a JWT has two.
    if token.count(".") == 2:
        return identities.from_access_token(token)
    return identities.from_token(token)


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
