"""What every page of the web UI shares: the signed-in viewer (`Viewer`), and `Web`, which finds
them, checks their CSRF token and scopes, and renders a page in the site's layout. The routes
themselves are broker/web/site.py's and broker.web.pages_*'s.

Every page acts as the signed-in user through the task service (broker/tasks/), as the API
does, and asks broker/authz.py whether they may: a user sees only their own tasks (admins see
all), and the scopes of the token a session was signed in with hold on every page (`read` to
look, `submit` to act).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse
from starlette.datastructures import FormData

from broker import authz
from broker.authz import Action
from broker.control.loop import ControlLoop
from broker.domain import Task
from broker.errors import NotPermitted
from broker.http.callers import identities_of
from broker.identity.resolve import USER_SCOPES, Caller, Identities
from broker.web import session as web_session
from broker.web.errors import error_title
from broker.web.features import Features, detect
from broker.web.render import page


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
    """What every page needs: the control loop, the viewer, the features, the base context."""

    def __init__(self, control: ControlLoop) -> None:
        self.control = control
        self.store = control.store

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
