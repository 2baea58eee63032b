"""Who opens a route, and whether they may. One function decides who the caller is
(`route_caller`): a Klique token or a single sign-on access token as a bearer header, through the
API's own rules (broker/http/callers.py), for programs; or, for browsers, the route's cookie, which
holds a route session: made by the route's origin in exchange for a one-time code, and naming
one user and one route (never a copy of an API token). A token's scopes hold here too: `read`
opens a route for plain reads, anything else (other methods, WebSockets) needs `submit`.

A browser opens a route through a code (`RouteKeys.mint`): minted on the UI's origin or by the
API for a signed-in caller, single use, for 60 seconds, kept as a digest; the route's origin
takes it in `?code=` once and answers with the route's cookie. No long-lived secret is ever put
in an address (where histories, logs and Referer headers would keep it).

Who may: a session's route opens to its owner and admins; an endpoint's to admins, its owner and
the teams it names (a static route: its teams).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from broker.authz import may_open_route
from broker.http.callers import Caller, caller_of
from broker.identity.resolve import Identities
from broker.store.identity import token_digest

COOKIE = "klique_route"
CODE_TTL_S = 60.0
SESSION_TTL_S = 12 * 3600.0
# Bounds on what is held in memory: past them, the oldest go first (a flood of codes cannot
# grow the server; it can only make its own flooder's codes expire sooner).
MAX_CODES = 10_000
MAX_SESSIONS = 100_000


@dataclass(frozen=True)
class RouteInfo:
    """What access needs to know of a route."""

    name: str
    kind: str  # session | endpoint
    owners: frozenset[str]  # the users whose apps serve it (sessions: one)
    teams: frozenset[str]
    static: bool


# What a code was minted on, asked again at each use of its route session: ("token", id) for a
# Klique token (or a browser session signed in with one), ("session", digest) for a browser
# session of single sign-on; None for a provider's access token (the route session's own end).
Proof = tuple[str, str] | None


@dataclass(frozen=True)
class RouteKey:
    """A code or a route session: who it speaks for, on which route, until when, on what."""

    caller: Caller
    route: str
    ends: float
    proof: Proof = None


class RouteKeys:
    """One-time codes and the route sessions they are exchanged for, by the SHA-256 of their
    secret (what the server holds could not open a route if read). Kept in the server's memory:
    a restart asks browsers to open their routes again from the UI or `klique app open`."""

    def __init__(self) -> None:
        self._codes: dict[str, RouteKey] = {}
        self._sessions: dict[str, RouteKey] = {}
        self._lock = threading.Lock()

    def mint(self, caller: Caller, route: str, proof: Proof = None) -> str:
        """A new code for this caller and route: good once, for CODE_TTL_S."""
        return self._add(self._codes, RouteKey(caller, route, 0, proof), CODE_TTL_S, MAX_CODES)

    def spend(self, code: str, route: str) -> RouteKey | None:
        """A live code of this route, spent; None for an unknown, spent, expired or other
        route's code (spent either way)."""
        with self._lock:
            found = self._codes.pop(token_digest(code), None)
        if found is None or found.ends <= time.time() or found.route != route:
            return None
        return found

    def start(self, code: RouteKey) -> str:
        """A new route session for a spent code: its caller, on its route, on its proof."""
        return self._add(self._sessions, code, SESSION_TTL_S, MAX_SESSIONS)

    def exchange(self, code: str, route: str) -> str | None:
        found = self.spend(code, route)
        return None if found is None else self.start(found)

    def session(self, secret: str, route: str) -> RouteKey | None:
        """A live route session, on this route only."""
        with self._lock:
            found = self._sessions.get(token_digest(secret))
        if found is None or found.ends <= time.time() or found.route != route:
            return None
        return found

    def _add(self, table: dict[str, RouteKey], key: RouteKey, ttl: float, bound: int) -> str:
        """Keep `key`, to end in `ttl` seconds, under a new secret's digest."""
        secret = secrets.token_urlsafe(32)
        now = time.time()
        with self._lock:
            if len(table) >= bound:
                live = {k: v for k, v in table.items() if v.ends > now}
                table.clear()
                table.update(list(live.items())[-(bound // 2) :])
            table[token_digest(secret)] = replace(key, ends=now + ttl)
        return secret


def proof_of_token(identities: Identities, token: str) -> Proof:
    """The proof a bearer token gives: a Klique token's id (a provider's JWT: none)."""
    if token.count(".") == 2:
        return None
    info = identities.store.token(token)
    return ("token", info.id) if info is not None else None


def proof_of_session(identities: Identities, cookie: str) -> Proof:
    """The proof a browser session gives: the token it stands for, else the session itself."""
    found = identities.store.session(cookie)
    if found is None:
        return None
    return ("token", found.token_id) if found.token_id else ("session", found.digest)


def proof_holds(identities: Identities, proof: Proof) -> bool:
    """Whether what a code was minted on is still in force: a revoked or expired token, or an
    ended browser session, ends the route sessions it opened."""
    if proof is None:
        return True
    kind, ident = proof
    now = time.time()
    if kind == "token":
        token = identities.store.token_by_id(ident)
        return token is not None and not token.revoked and not token.expired(now)
    session = identities.store.session_by_digest(ident)
    return session is not None and now < session.expires_at


def route_caller(
    identities: Identities,
    keys: RouteKeys,
    route: str,
    headers: Mapping[str, str],
    cookies: Mapping[str, str],
) -> tuple[Caller | None, str]:
    """The caller and how they proved it ("bearer", "cookie"; "" when they did not). Another
    scheme in Authorization is the app's own business (JupyterLab sends `token ...`)."""
    authorization = headers.get("authorization") or ""
    if authorization[:7].lower() == "bearer ":
        return caller_of(identities, authorization[7:].strip()), "bearer"
    cookie = cookies.get(COOKIE, "")
    if cookie:
        found = keys.session(cookie, route)
        if found is None or not proof_holds(identities, found.proof):
            return None, "cookie"
        return found.caller, "cookie"
    return None, ""


def may_open(caller: Caller, team: str | None, route: RouteInfo) -> bool:
    return may_open_route(caller, team, route)  # the rule is broker/authz.py's


def cookie_header(session: str, name: str, secure: bool) -> str:
    """The route's cookie: a route session, on the route's own origin (no Domain: this host
    only), sent back only to this route's paths, never to scripts, and not on cross-site
    requests other than top-level navigations."""
    flags = f"Path=/routes/{name}/; HttpOnly; SameSite=Lax"
    return f"{COOKIE}={session}; {flags}{'; Secure' if secure else ''}"
