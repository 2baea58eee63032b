"""The browser's single sign-on: the authorization-code flow with PKCE (Authlib's client),
then a session cookie bound to a record on the server (docs/identity.md has the contract).

- `GET /auth/login?next=/path`: to the provider, with state, nonce and an S256 code challenge;
  the attempt is remembered on the server for 10 minutes, bound to this browser by the
  `klique_login` cookie.
- `GET /auth/callback`: the state must be this browser's; the code is exchanged with the
  verifier; the ID token is verified (signature, issuer, audience, expiry, nonce); then a new
  session: `klique_session` (HttpOnly, SameSite=Lax, Secure over TLS); its CSRF token, to send
  back as the X-Klique-CSRF header, is in the UI's pages, never in a cookie. A session id is
  never taken from the browser: it is made here, new at every login (no session fixation).
- `POST /auth/logout`: ends the session (CSRF header required).
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Annotated, Any

from authlib.common.security import generate_token
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse
from pydantic import BaseModel

from broker.http.cookies import (
    CSRF_HEADER,
    SESSION_COOKIE,
    clear_session_cookies,
    set_session_cookies,
)
from broker.identity.authlib_httpx import OAuthError
from broker.identity.oidc import InvalidToken, Provider, ProviderUnreachable
from broker.identity.resolve import Identities, Refused, session_fresh_until
from broker.store.identity import token_digest

LOGIN_COOKIE = "klique_login"
_LOGIN_TTL_S = 600.0
_MAX_PENDING = 10_000
# Where a login may lead back to: a path on this server, never another site ("//host").
_NEXT = r"^/([^/\\\s][^\s\\]*)?$"
_PARAM = r"^[\x21-\x7e]*$"  # what a code, a state or an error may hold: printable, no spaces


@dataclass(frozen=True)
class _Pending:
    state: str
    nonce: str
    verifier: str
    next: str
    redirect_uri: str
    created: float


class LogoutOut(BaseModel):
    ok: bool
    end_session_endpoint: str | None  # the provider's, to end its session too


class _PendingLogins:
    def __init__(self) -> None:
        self._items: dict[str, _Pending] = {}
        self._lock = threading.Lock()

    def add(self, login_id: str, pending: _Pending) -> None:
        with self._lock:
            now = time.time()
            self._items = {k: v for k, v in self._items.items() if now - v.created < _LOGIN_TTL_S}
            if len(self._items) >= _MAX_PENDING:
                raise HTTPException(429, "too many logins in progress; try again in a minute")
            self._items[login_id] = pending

    def pop(self, login_id: str) -> _Pending | None:
        with self._lock:
            found = self._items.pop(login_id, None)
        if found is None or time.time() - found.created >= _LOGIN_TTL_S:
            return None
        return found


def browser_routes(identities: Identities) -> APIRouter:
    router = APIRouter(tags=["browser single sign-on"])
    pending = _PendingLogins()

    def provider() -> Provider:
        found = identities.provider()
        if found is None:
            raise HTTPException(404, "this server has no single sign-on (identity.oidc)")
        return found

    @router.get(
        "/auth/login",
        response_class=RedirectResponse,
        status_code=302,
        responses={302: {"description": "to the provider's login page"}},
    )
    def login(
        request: Request, next: Annotated[str, Query(pattern=_NEXT, max_length=2048)] = "/"
    ) -> RedirectResponse:
        oidc = provider()
        redirect_uri = _redirect_uri(identities, request)
        verifier, nonce = generate_token(64), generate_token(32)
        try:
            endpoint = oidc.endpoint("authorization_endpoint")
        except ProviderUnreachable as exc:
            raise HTTPException(503, f"cannot reach the single sign-on provider: {exc}") from None
        with oidc.client(redirect_uri) as oauth:
            url, state = oauth.create_authorization_url(
                endpoint, code_verifier=verifier, nonce=nonce
            )
        login_id = secrets.token_urlsafe(32)
        pending.add(login_id, _Pending(state, nonce, verifier, next, redirect_uri, time.time()))
        response = RedirectResponse(url, 302)
        response.set_cookie(
            LOGIN_COOKIE,
            login_id,
            max_age=int(_LOGIN_TTL_S),
            path="/auth",
            httponly=True,
            samesite="lax",
            secure=redirect_uri.startswith("https://"),
        )
        return response

    @router.get(
        "/auth/callback",
        response_class=RedirectResponse,
        status_code=303,
        responses={303: {"description": "logged in: back to where the login started"}},
    )
    def callback(
        request: Request,
        code: Annotated[str | None, Query(pattern=_PARAM, max_length=4096)] = None,
        state: Annotated[str | None, Query(pattern=_PARAM, max_length=4096)] = None,
        error: Annotated[str | None, Query(pattern=_PARAM, max_length=200)] = None,
    ) -> RedirectResponse:
        found = pending.pop(request.cookies.get(LOGIN_COOKIE) or "")
        if found is None or not hmac.compare_digest(state or "", found.state):
            raise HTTPException(
                400,
                "this login was not started in this browser, or took over 10 minutes; "
                "start again at /auth/login",
            )
        if error or not code:
            raise HTTPException(400, f"the provider refused the login ({error or 'no code'})")
        who, claims, tokens = _finish(identities, provider(), found, code)
        old = request.cookies.get(SESSION_COOKIE)
        if old:
            identities.store.end_session(token_digest(old))
        assert identities.identity is not None
        cookie, _csrf = identities.store.add_session(
            who.user,
            identities.user_and_groups(claims)[1],
            str(tokens.get("refresh_token") or ""),
            session_fresh_until(tokens),
            time.time() + identities.identity.session_lifetime,
        )
        response = RedirectResponse(found.next, 303)
        secure = found.redirect_uri.startswith("https://")
        response.delete_cookie(LOGIN_COOKIE, path="/auth")
        set_session_cookies(response, cookie, secure)
        return response

    @router.post("/auth/logout")
    def logout(request: Request) -> LogoutOut:
        """End this browser's session (needs the X-Klique-CSRF header)."""
        cookie = request.cookies.get(SESSION_COOKIE)
        if not cookie:
            raise HTTPException(401, "no session to end")
        try:
            identities.from_session(cookie, True, request.headers.get(CSRF_HEADER))
        except Refused as exc:
            raise HTTPException(exc.status, str(exc)) from None
        identities.store.end_session(token_digest(cookie))
        oidc = identities.provider()
        try:
            end = oidc.discovery().get("end_session_endpoint") if oidc else None
        except ProviderUnreachable:
            end = None
        body = LogoutOut(ok=True, end_session_endpoint=end if isinstance(end, str) else None)
        response = JSONResponse(body.model_dump())
        clear_session_cookies(response)
        return response  # type: ignore[return-value]

    return router


def _redirect_uri(identities: Identities, request: Request) -> str:
    identity = identities.identity
    public = identity.oidc.public_url if identity and identity.oidc else None
    base = public or str(request.base_url)
    return base.rstrip("/") + "/auth/callback"


def _finish(
    identities: Identities, oidc: Provider, found: _Pending, code: str
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Exchange the code, verify the ID token, and decide who this is."""
    try:
        tokens = oidc.exchange(code, found.redirect_uri, found.verifier)
        claims = oidc.verify(
            str(tokens.get("id_token") or ""), nonce=found.nonce, audience=oidc.settings.client_id
        )
        who = identities.from_claims(claims, "session")
    except (OAuthError, InvalidToken) as exc:
        raise HTTPException(400, f"the login could not be completed: {exc}") from None
    except ProviderUnreachable as exc:
        raise HTTPException(503, f"cannot reach the single sign-on provider: {exc}") from None
    except Refused as exc:
        raise HTTPException(exc.status, str(exc)) from None
    return who, claims, tokens
