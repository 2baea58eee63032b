"""Who opens a route, and whether they may. One function decides who the caller is
(`route_caller`), through the API's own rules (broker/api/auth.py): a Klique token or a single
sign-on access token as a bearer header, or in the route's cookie that the
`/routes/NAME/?token=TOKEN` handshake sets. A token's scopes hold here too: `read` opens a
route for plain reads, anything else (other methods, WebSockets) needs `submit`.

Who may: a session's route opens to its owner and admins; an endpoint's to admins, its owner and
the teams it names (a static route: its teams).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker.api.auth import Caller, caller_of
from broker.identity.resolve import Identities

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
    identities: Identities, headers: Mapping[str, str], cookies: Mapping[str, str]
) -> tuple[Caller | None, str]:
    """The caller and how they proved it ("bearer", "cookie"; "" when they did not). Another
    scheme in Authorization is the app's own business (JupyterLab sends `token ...`)."""
    authorization = headers.get("authorization") or ""
    if authorization[:7].lower() == "bearer ":
        return caller_of(identities, authorization[7:].strip()), "bearer"
    cookie = cookies.get(COOKIE, "")
    if cookie:
        return caller_of(identities, cookie), "cookie"
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
