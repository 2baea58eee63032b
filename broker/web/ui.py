"""The web UI's routes under `/` (the API stays under /api/v1): sign-in, the shared pieces of
every page, the vendored static files, and the pages of broker.web.pages_*.

Every page acts as the signed-in user through the API's own functions, and asks broker/authz.py
whether they may, as the API does: a user sees only their own tasks (admins see all), and the
scopes of the token a session was signed in with hold on every page (`read` to look, `submit`
to act).
"""

from __future__ import annotations

import hmac
import mimetypes
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import quote

import httpx
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.datastructures import FormData

from broker import authz
from broker.api.app import API
from broker.api.auth import identities_of
from broker.api.identity_web import clear_session_cookies
from broker.authz import Action
from broker.domain import Task
from broker.errors import NotPermitted
from broker.identity.resolve import USER_SCOPES, Caller, Identities, Refused
from broker.scheduler.loop import Scheduler
from broker.store.repository import token_digest
from broker.web import session as web_session
from broker.web.errors import error_title
from broker.web.features import Features, detect
from broker.web.render import HEADERS, page


@dataclass(frozen=True)
class Viewer:
    """The signed-in user, as the API's permission checks know them, and their CSRF token."""

    user: str
    admin: bool
    csrf: str
    team: str | None = None
    scopes: frozenset[str] = USER_SCOPES

    @property
    def caller(self) -> Caller:
        return Caller(self.user, self.admin, self.team, scopes=self.scopes, via="session")


class Web:
    """What every page needs: the scheduler, the viewer, the features, the base context."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.store = scheduler.store

    def identities(self, request: Request) -> Identities:
        return identities_of(request.app)

    def viewer(self, request: Request, needs: str = "read") -> Viewer:
        """The signed-in user, whose session's token has the scope `needs` (a page looks: read),
        as authz decides for the API: 403 when it has not; a redirect to sign in (401 for live
        updates) when no one is signed in."""
        who = self.signed_in(request)
        try:
            authz.check_scope(who, needs)
        except NotPermitted as exc:
            raise HTTPException(403, str(exc)) from None
        return who

    def signed_in(self, request: Request) -> Viewer:
        """The signed-in user, whatever their scopes; otherwise a redirect to sign in."""
        found = web_session.current(self.identities(request), request)
        if found is not None:
            who = found.caller
            return Viewer(who.user, who.admin, found.csrf, who.team, who.scopes)
        wants_page = request.method == "GET" and "text/html" in request.headers.get("accept", "")
        if not wants_page:
            raise HTTPException(401, "not signed in; sign in at /login")
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise HTTPException(303, headers={"Location": f"/login?next={quote(target, safe='')}"})

    async def posted(self, request: Request, acts: bool = True) -> tuple[Viewer, FormData]:
        """The viewer and the form of a state-changing request, after its CSRF check; one that
        `acts` needs the session's token to have the `submit` scope."""
        who = self.signed_in(request)
        form = await request.form()
        given = form.get(web_session.CSRF_FIELD) or request.headers.get(web_session.CSRF_HEADER)
        if not (who.csrf and isinstance(given, str) and hmac.compare_digest(who.csrf, given)):
            raise HTTPException(403, "missing or wrong CSRF token; reload the page and try again")
        if acts:
            try:
                authz.check_scope(who, "submit")
            except NotPermitted as exc:
                raise HTTPException(403, str(exc)) from None
        return who, form

    def task(self, who: Viewer, task_id: int, action: Action = Action.READ_TASK) -> Task:
        """The task, if authz lets the viewer do `action` to it (NotFound as for none)."""
        return authz.find_task(self.store.get, who, action, task_id)

    async def call_api(
        self, request: Request, who: Viewer, method: str, path: str, body: Any = None
    ) -> httpx.Response:
        """This server's own API, called in-process as the signed-in browser (its cookie and
        CSRF token), for features whose logic lives only behind the API."""
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=request.app),
            base_url="http://klique.local",
            cookies={
                web_session.SESSION_COOKIE: request.cookies.get(web_session.SESSION_COOKIE, ""),
            },
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
        title = error_title(status)
        return self.page(
            request, who, "error.html", status, code=status, title=title, message=message
        )


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
