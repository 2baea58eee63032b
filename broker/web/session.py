"""Signed-in browsers, for the web UI: the identity feature's browser sessions (one session
model and one CSRF contract for the whole server; docs/identity.md) and the sign-in form.

A session is made by the server, new at every sign-in (no session fixation): by single sign-on
(`/auth/login`, broker/api/identity_web.py), or here from a Klique token typed into the sign-in
form or made by an LDAP password. A session signed in with a token stands for that token: its
revocation or expiry ends the session. Its one cookie is `klique_session` (HttpOnly, SameSite=Lax,
Secure over TLS). Every state-changing request made with the session must send the session's
CSRF token back: the `X-Klique-CSRF` header (the API, htmx), or the `csrf` form field of the UI's
plain forms. The token is carried in the page only (base.html's hx-headers, the forms' hidden
field), never in a cookie: the server makes it from the session's cookie (`session_csrf`) and
checks it against the digest it keeps. Routes are on another origin (broker/route_proxy/origin.py),
and no script there or here can read the session's cookie, so none can learn the token.

The sign-in form, before any session exists, is protected by a double-submit token (a cookie
and a hidden field that must agree).
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass

from fastapi import Request, Response

from broker.http.cookies import CSRF_HEADER, SESSION_COOKIE, SIGNIN_COOKIE, set_session_cookies
from broker.identity.resolve import Caller, Identities, Refused
from broker.store.identity import session_csrf, token_digest

__all__ = ["CSRF_FIELD", "CSRF_HEADER", "SESSION_COOKIE", "SignedIn", "current", "sign_in"]

CSRF_FIELD = "csrf"
LIFETIME_S = 12 * 3600  # without an identity section in the estate


@dataclass(frozen=True)
class SignedIn:
    caller: Caller
    csrf: str  # what every state-changing request of this session must send back


def current(identities: Identities, request: Request) -> SignedIn | None:
    """The browser's live session, and its CSRF token ("" for a session whose token is not made
    from its cookie, one made before tokens were: it may read, as the API lets it, but not act;
    signing in again makes a new one)."""
    cookie = request.cookies.get(SESSION_COOKIE)
    if not cookie or len(cookie) > 200:
        return None
    try:
        who = identities.from_session(cookie, False, None)
    except Refused:
        return None
    csrf = session_csrf(cookie)
    found = identities.store.session(cookie)
    ours = found is not None and hmac.compare_digest(token_digest(csrf), found.csrf_digest)
    return SignedIn(who, csrf if ours else "")


def sign_in(identities: Identities, request: Request, response: Response, token: str) -> Caller:
    """A new session for a Klique token in force, its cookies set on `response`; the browser's
    previous session ends. Raises Refused for a token that is unknown, revoked or expired."""
    who = identities.from_token(token)
    info = identities.store.token(token)
    assert info is not None  # from_token found it
    identity = identities.identity
    ends = time.time() + (identity.session_lifetime if identity else LIFETIME_S)
    if info.expires_at is not None:
        ends = min(ends, info.expires_at)
    old = request.cookies.get(SESSION_COOKIE)
    if old:
        identities.store.end_session(token_digest(old))
    cookie, _csrf = identities.store.add_session(
        who.user, info.groups, "", ends, ends, token_id=info.id
    )
    set_session_cookies(response, cookie, secure=request.url.scheme == "https")
    return who


def csrf_ok(signed: SignedIn, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest(signed.csrf, str(given))


# The sign-in form, before a session exists: a double-submit token.


def signin_token(request: Request) -> str:
    """The sign-in form's token: the one its cookie already holds, or a new one."""
    return request.cookies.get(SIGNIN_COOKIE) or secrets.token_urlsafe(24)


def set_signin_cookie(request: Request, response: Response, value: str) -> None:
    response.set_cookie(
        SIGNIN_COOKIE,
        value,
        max_age=3600,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def signin_token_ok(request: Request, given: str | None) -> bool:
    expected = request.cookies.get(SIGNIN_COOKIE)
    return bool(expected and given) and hmac.compare_digest(str(expected), str(given))
