"""Signed-in browsers: the session cookie, its server-side record, and CSRF tokens.

The cookie holds a random session id (256 bits); the store keeps only its SHA-256, with the
user, the admin flag and an expiry. A login always makes a new id (no session fixation) and a
logout deletes the record. Cookies are HttpOnly and SameSite=Lax (Secure over HTTPS).

Every state-changing request made with the cookie must carry the session's CSRF token, in the
form field `csrf` or the header `X-CSRF-Token`. The token is an HMAC of the session id, so it
is never stored and cannot be made without the cookie. The login form, before any session
exists, is protected by a double-submit token (a cookie and a hidden field that must agree).

`start_session` is the one way in: the token login calls it, and single sign-on will call it
for an identity it has verified.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from fastapi import Request, Response

from broker.store import web as web_store
from broker.store.repository import Store, token_digest

COOKIE = "klique_session"
LOGIN_COOKIE = "klique_login"
CSRF_FIELD = "csrf"
CSRF_HEADER = "X-CSRF-Token"
LIFETIME_S = 12 * 3600
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class WebSession:
    user: str
    admin: bool
    csrf: str  # what every state-changing request of this session must send back


def _csrf_of(session_id: str) -> str:
    return hmac.new(session_id.encode(), b"klique-csrf", hashlib.sha256).hexdigest()


def start_session(store: Store, user: str, admin: bool) -> str:
    """A new session for a verified identity; returns the cookie's value (set it with
    `set_cookie`). The token login and single sign-on both come through here."""
    session_id = secrets.token_urlsafe(32)
    web_store.add_session(store, token_digest(session_id), user, admin, LIFETIME_S)
    return session_id


def login_with_token(store: Store, token: str) -> str | None:
    """A session for a valid Klique token's user; None for an unknown token."""
    found = store.user_for_token(token.strip()) if token.strip() else None
    if found is None:
        return None
    user, admin = found
    return start_session(store, user, admin)


def current(store: Store, request: Request) -> WebSession | None:
    session_id = request.cookies.get(COOKIE)
    if not session_id or len(session_id) > 200:
        return None
    found = web_store.session_user(store, token_digest(session_id))
    if found is None:
        return None
    return WebSession(found[0], found[1], _csrf_of(session_id))


def end_session(store: Store, request: Request, response: Response) -> None:
    session_id = request.cookies.get(COOKIE)
    if session_id:
        web_store.drop_session(store, token_digest(session_id))
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="lax")


def set_cookie(request: Request, response: Response, session_id: str) -> None:
    response.set_cookie(
        COOKIE,
        session_id,
        max_age=LIFETIME_S,
        path="/",
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )


def csrf_ok(session: WebSession, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest(session.csrf, str(given))


# The login form, before a session exists: a double-submit token.


def login_token(request: Request) -> str:
    """The login form's token: the one its cookie already holds, or a new one."""
    return request.cookies.get(LOGIN_COOKIE) or secrets.token_urlsafe(24)


def set_login_cookie(request: Request, response: Response, value: str) -> None:
    response.set_cookie(
        LOGIN_COOKIE,
        value,
        max_age=3600,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def login_token_ok(request: Request, given: str | None) -> bool:
    expected = request.cookies.get(LOGIN_COOKIE)
    return bool(expected and given) and hmac.compare_digest(str(expected), str(given))
