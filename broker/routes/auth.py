"""Who opens a route, and whether they may. One function decides who the caller is
(`route_caller`): the Klique token as a bearer header, or the route's cookie that the
`/routes/NAME/?token=TOKEN` handshake sets. Single sign-on and the web UI extend this function.

Who may: a session's route opens to its owner and admins; an endpoint's to admins, its owner and
the teams it names (a static route: its teams).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker.api.auth import Caller, caller_of
from broker.store.repository import Store

COOKIE = "klique_route"


@dataclass(frozen=True)
class RouteInfo:
    """What access needs to know of a route."""

    name: str
    kind: str  # session | endpoint
    owners: frozenset[str]  # the users whose apps serve it (sessions: one)
    teams: frozenset[str]
    static: bool


def route_caller(
    store: Store, headers: Mapping[str, str], cookies: Mapping[str, str]
) -> tuple[Caller | None, str]:
    """The caller and how they proved it ("bearer", "cookie"; "" when they did not). Another
    scheme in Authorization is the app's own business (JupyterLab sends `token ...`)."""
    authorization = headers.get("authorization") or ""
    if authorization[:7].lower() == "bearer ":
        return caller_of(store, authorization[7:].strip()), "bearer"
    cookie = cookies.get(COOKIE, "")
    if cookie:
        return caller_of(store, cookie), "cookie"
    return None, ""


def may_open(caller: Caller, team: str | None, route: RouteInfo) -> bool:
    if caller.admin:
        return True
    if route.kind == "session":
        return caller.user in route.owners
    if not route.static and caller.user in route.owners:
        return True
    return team is not None and team in route.teams


def cookie_header(token: str, name: str, secure: bool) -> str:
    """The route's cookie: the token, sent back only to this route's paths, never to scripts,
    and not on cross-site requests other than top-level navigations."""
    flags = f"Path=/routes/{name}/; HttpOnly; SameSite=Lax"
    return f"{COOKIE}={token}; {flags}{'; Secure' if secure else ''}"
