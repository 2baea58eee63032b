"""The web UI's routes under `/` (the API stays under /api/v1): sign-in, the shared pieces of
every page, the vendored static files, and the pages of broker.web.pages_*.

Every page acts as the signed-in user through the API's own functions and permission rules
(`owned_task`, `usage_out`, ...): a user sees only their own tasks; admins see all.
"""

from __future__ import annotations

import mimetypes
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import quote

import httpx
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.datastructures import FormData

from broker.api.auth import Caller
from broker.scheduler.loop import Scheduler
from broker.web import session as web_session
from broker.web.features import Features, detect
from broker.web.render import HEADERS, page


@dataclass(frozen=True)
class Viewer:
    """The signed-in user, as the API's permission checks know them, and their CSRF token."""

    user: str
    admin: bool
    csrf: str

    @property
    def caller(self) -> Caller:
        return Caller(self.user, self.admin)


class Web:
    """What every page needs: the scheduler, the viewer, the features, the base context."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.store = scheduler.store

    def viewer(self, request: Request) -> Viewer:
        """The signed-in user; otherwise a redirect to sign in (401 for live updates)."""
        found = web_session.current(self.store, request)
        if found is not None:
            return Viewer(found.user, found.admin, found.csrf)
        wants_page = request.method == "GET" and "text/html" in request.headers.get("accept", "")
        if not wants_page:
            raise HTTPException(401, "not signed in; sign in at /login")
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise HTTPException(303, headers={"Location": f"/login?next={quote(target, safe='')}"})

    async def posted(self, request: Request) -> tuple[Viewer, FormData]:
        """The viewer and the form of a state-changing request, after its CSRF check."""
        who = self.viewer(request)
        form = await request.form()
        given = form.get(web_session.CSRF_FIELD) or request.headers.get(web_session.CSRF_HEADER)
        session = web_session.WebSession(who.user, who.admin, who.csrf)
        if not web_session.csrf_ok(session, given if isinstance(given, str) else None):
            raise HTTPException(403, "missing or wrong CSRF token; reload the page and try again")
        return who, form

    async def call_api(
        self, request: Request, who: Viewer, method: str, path: str, body: Any = None
    ) -> httpx.Response:
        """This server's own API, called in-process as the signed-in browser (its cookie and
        CSRF token), for features whose logic lives only behind the API."""
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=request.app),
            base_url="http://klique.local",
            cookies={web_session.COOKIE: request.cookies.get(web_session.COOKIE, "")},
            headers={web_session.CSRF_HEADER: who.csrf},
        ) as client:
            return await client.request(method, path, json=body)

    def features(self, request: Request) -> Features:
        return detect(request.app)

    def page(
        self, request: Request, who: Viewer, template: str, status: int = 200, **context: Any
    ) -> HTMLResponse:
        return page(
            template,
            status,
            who=who,
            csrf=who.csrf,
            features=self.features(request),
            path=request.url.path,
            **context,
        )

    def error(self, request: Request, who: Viewer, status: int, message: str) -> HTMLResponse:
        return self.page(request, who, "error.html", status, message=message)


def safe_next(target: str | None) -> str:
    """Only a path on this server: never another site (no open redirect)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


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


def web_router(scheduler: Scheduler) -> APIRouter:
    from broker.web import live, pages_estate, pages_tasks

    router = APIRouter(include_in_schema=False)
    web = Web(scheduler)
    static = _static_files()

    @router.get("/static/{name:path}")
    def static_file(name: str) -> Response:
        if name not in static:
            raise HTTPException(404, "no such file")
        body, kind = static[name]
        headers = {"Cache-Control": "public, max-age=3600", "X-Content-Type-Options": "nosniff"}
        return Response(body, media_type=kind, headers=headers)

    @router.get("/login")
    def login_form(request: Request, next: str | None = None) -> HTMLResponse:
        token = web_session.login_token(request)
        response = page("login.html", next=safe_next(next), login_token=token, error="")
        web_session.set_login_cookie(request, response, token)
        return response

    @router.post("/login")
    async def login(request: Request) -> Response:
        form = await request.form()
        target = safe_next(str(form.get("next") or "/"))
        given = form.get("login_token")
        if not web_session.login_token_ok(request, given if isinstance(given, str) else None):
            raise HTTPException(403, "missing or wrong login form token; reload the sign-in page")
        session_id = web_session.login_with_token(web.store, str(form.get("token") or ""))
        if session_id is None:
            token = web_session.login_token(request)
            response: Response = page(
                "login.html",
                401,
                next=target,
                login_token=token,
                error="That token is not valid here. Run `klique login` or ask an admin "
                "for a token (`klique token create USER`).",
            )
            return response
        response = RedirectResponse(target, status_code=303, headers=HEADERS)
        web_session.set_cookie(request, response, session_id)
        response.delete_cookie(web_session.LOGIN_COOKIE, path="/")
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        await web.posted(request)
        response = RedirectResponse("/login", status_code=303, headers=HEADERS)
        web_session.end_session(web.store, request, response)
        return response

    pages_tasks.add_routes(router, web)
    pages_estate.add_routes(router, web)
    live.add_routes(router, web)
    return router
