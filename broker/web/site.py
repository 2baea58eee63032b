"""The web UI's routes under `/` (the API stays under /api/v1): the vendored static files,
sign-in and sign-out, and the pages of broker.web.pages_* and broker/web/live.py; and
`mount_web`, which puts them and the error pages on the server's app."""

from __future__ import annotations

import mimetypes
from importlib import resources
from typing import Any

import httpx
from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.datastructures import FormData

from broker.control.loop import ControlLoop
from broker.http.callers import identities_of
from broker.http.cookies import clear_session_cookies
from broker.http.paths import API
from broker.identity.resolve import Refused
from broker.store.identity import token_digest
from broker.web import (
    live,
    pages_datasets,
    pages_estate,
    pages_models,
    pages_tasks,
    pages_tuning,
)
from broker.web import session as web_session
from broker.web.errors import install_error_pages
from broker.web.render import HEADERS, page
from broker.web.ui import Web, safe_next


def mount_web(app: FastAPI, control: ControlLoop) -> None:
    """The site on the server's app, and its error pages for browsers' requests for pages."""
    app.include_router(web_router(control))
    install_error_pages(app, Web(control))


def _static_files() -> dict[str, tuple[bytes, str]]:
    """Every file under broker/web/static, read once: only these names are ever served."""
    root = resources.files("broker.web") / "static"
    found: dict[str, tuple[bytes, str]] = {}

    def walk(folder: Any, prefix: str) -> None:
        for entry in folder.iterdir():
            name = f"{prefix}{entry.name}"
            if entry.is_dir():
                walk(entry, name + "/")
            else:
                kind = mimetypes.guess_type(entry.name)[0] or "application/octet-stream"
                found[name] = (entry.read_bytes(), kind)

    walk(root, "")
    return found


def web_router(control: ControlLoop) -> APIRouter:
    """The whole site: static files, sign-in and sign-out, and every page."""
    router = APIRouter(include_in_schema=False)
    web = Web(control)
    static = _static_files()

    @router.get("/static/{name:path}")
    def static_file(name: str) -> Response:
        if name not in static:
            raise HTTPException(404, "no such file")
        body, kind = static[name]
        headers = {"Cache-Control": "public, max-age=3600", "X-Content-Type-Options": "nosniff"}
        return Response(body, media_type=kind, headers=headers)

    def login_page(request: Request, status: int, target: str, error: str) -> HTMLResponse:
        identity = identities_of(request.app).identity
        token = web_session.signin_token(request)
        response = page(
            "login.html",
            status,
            next=target,
            login_token=token,
            error=error,
            sso=bool(identity and identity.oidc),
            ldap=bool(identity and identity.ldap),
        )
        web_session.set_signin_cookie(request, response, token)
        return response

    @router.get("/login")
    def login_form(request: Request, next: str | None = None) -> HTMLResponse:
        return login_page(request, 200, safe_next(next), "")

    @router.post("/login")
    async def login(request: Request) -> Response:
        form = await request.form()
        target = safe_next(str(form.get("next") or "/"))
        given = form.get("login_token")
        if not web_session.signin_token_ok(request, given if isinstance(given, str) else None):
            raise HTTPException(403, "missing or wrong login form token; reload the sign-in page")
        token, error = str(form.get("token") or "").strip(), NOT_VALID_HERE
        if form.get("ldap_user"):
            token, error = await _ldap_token(request, form)
        response: Response = RedirectResponse(target, status_code=303, headers=HEADERS)
        try:
            web_session.sign_in(identities_of(request.app), request, response, token)
        except Refused as exc:
            return login_page(request, 401, target, error or str(exc))
        response.delete_cookie(web_session.SIGNIN_COOKIE, path="/")
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        await web.posted(request, acts=False)  # a read-only session may sign out too
        response = RedirectResponse("/login", status_code=303, headers=HEADERS)
        identities_of(request.app).store.end_session(
            token_digest(request.cookies.get(web_session.SESSION_COOKIE, ""))
        )
        clear_session_cookies(response)
        return response

    pages_tasks.add_routes(router, web)
    pages_estate.add_routes(router, web)
    pages_models.add_routes(router, web)
    pages_datasets.add_routes(router, web)
    pages_tuning.add_routes(router, web)
    live.add_routes(router, web)
    return router


NOT_VALID_HERE = (
    "That token is not valid here. Run `klique login` or ask an admin "
    "for a token (`klique token create USER`)."
)


async def _ldap_token(request: Request, form: FormData) -> tuple[str, str]:
    """A Klique token for an LDAP password, from the API's own LDAP login (its checks, its
    slowing of failures); ("", the API's refusal) when it says no."""
    body = {"user": str(form.get("ldap_user") or ""), "password": str(form.get("password") or "")}
    # The browser's address, not the loopback's: the API counts failures per source address.
    peer = (request.client.host, request.client.port) if request.client else ("unknown", 0)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=request.app, client=peer),
        base_url="http://klique.local",
    ) as client:
        answer = await client.post(f"{API}/auth/ldap", json=body)
    if answer.status_code != 201:
        detail = answer.json().get("detail") if answer.content else None
        return "", str(detail) if isinstance(detail, str) else "The directory refused the login."
    return str(answer.json()["token"]), ""
