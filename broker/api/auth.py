"""The one authentication dependency every route uses: a Klique token or a single sign-on
access token (`Authorization: Bearer ...`), or a browser session cookie (with its CSRF header
for requests that change something). Read-only tokens may only read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Header, HTTPException, Request

from broker.identity.resolve import Caller, Identities, Refused

SESSION_COOKIE = "klique_session"
CSRF_COOKIE = "klique_csrf"
CSRF_HEADER = "X-Klique-CSRF"
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})


def make_caller(identities: Identities) -> Callable[..., Caller]:
    def caller(request: Request, authorization: Annotated[str | None, Header()] = None) -> Caller:
        try:
            who = _resolve(identities, request, authorization)
        except Refused as exc:
            raise HTTPException(exc.status, str(exc)) from None
        needed = "read" if request.method in _SAFE else "submit"
        if needed not in who.scopes:
            raise HTTPException(
                403,
                f"this token may only {' and '.join(sorted(who.scopes))}; this request needs "
                f"the {needed!r} scope (ask for a token with --scope {needed})",
            )
        return who

    return caller


def _resolve(identities: Identities, request: Request, authorization: str | None) -> Caller:
    token = (authorization or "").removeprefix("Bearer ").strip()
    if token:
        # Klique's tokens are URL-safe base64 without dots; a JWT has two.
        if token.count(".") == 2:
            return identities.from_access_token(token)
        return identities.from_token(token)
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        unsafe = request.method not in _SAFE
        return identities.from_session(cookie, unsafe, request.headers.get(CSRF_HEADER))
    raise Refused(
        401,
        "missing or unknown token; run `klique login --token TOKEN` (the server prints where "
        "its admin token is), or `klique login --sso` where single sign-on is set up",
    )
