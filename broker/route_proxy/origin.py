"""Where routes live: on an origin of their own, never the UI's and API's.

An app's page runs scripts that Klique does not control. Served from the UI's origin, they could
read what the UI's pages hold and act through the viewer's session. So the server has two
listeners: the UI and API on one, routes on the other (`klique server --routes-port`), and a
route's address is on the routes' origin: with a wildcard domain (`--routes-domain`), a host of
its own per route (`NAME.DOMAIN`, as JupyterHub's subdomains), else the routes listener's one
origin (another port, another origin to the browser). Paths keep their form, `/routes/NAME/...`,
so that an app that knows its base URL (JupyterLab's `base_url`) works in both.

On the UI's origin, `/routes/...` only sends a browser on: with a code for a signed-in viewer
who may open the route, else to the route's address (where the route says how to sign in).
On the routes' origin, nothing but routes is served.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Header, HTTPException, Request
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from broker.http.asgi import ASGIApp, Receive, Scope, Send, answer
from broker.http.callers import UNKNOWN_CALLER, bearer, caller_of, identities_of
from broker.http.cookies import SESSION_COOKIE
from broker.http.paths import API
from broker.identity.resolve import Caller, Identities, Refused
from broker.names import NAME
from broker.route_proxy import headers as passing
from broker.route_proxy.access import (
    CODE_TTL_S,
    Proof,
    RouteKeys,
    may_open,
    proof_of_session,
    proof_of_token,
)
from broker.route_proxy.hub import Hub

WILDCARD = "*"
NAME_RE = re.compile(NAME)


@dataclass(frozen=True)
class RoutesPlace:
    """The routes listener's port and the routes' public address: `url` with `*` standing for
    the route's name (a wildcard domain: `https://*.routes.example.org`), or one origin for all
    (`http://hpc.example.org:8766`)."""

    port: int
    url: str

    @property
    def wildcard(self) -> bool:
        return WILDCARD in self.url

    def origin(self, name: str) -> str:
        return self.url.replace(WILDCARD, name)

    def address(self, name: str) -> str:
        """The route's address, as users open it."""
        return f"{self.origin(name)}/routes/{name}/"

    def host_name(self, host: str) -> str | None:
        """The route a request's Host names under the wildcard domain (None: not one)."""
        suffix = (urlsplit(self.url).hostname or "").removeprefix(WILDCARD)
        label = host.rsplit(":", 1)[0].lower() if not host.startswith("[") else ""
        if not suffix or not label.endswith(suffix):
            return None
        name = label.removesuffix(suffix)
        return name if NAME_RE.fullmatch(name) else None


def routes_place(
    host: str,
    port: int,
    routes_port: int,
    domain: str | None,
    public: str | None = None,
    scheme: str = "http",
) -> RoutesPlace:
    """`klique server`'s options as a place: `NAME.DOMAIN` on the routes port with a wildcard
    domain, else the API's host on the routes port (over `scheme`: https when the server
    serves TLS itself); or the public address a proxy in front serves them at
    (`https://*.routes.example.org`, `*` for the name)."""
    if routes_port == port:
        raise ValueError(
            f"--routes-port {routes_port} is the API's port: routes need an origin of their "
            "own (another port, or --routes-domain and a port of their own)"
        )
    everywhere = host in ("0.0.0.0", "::", "")  # noqa: S104 (read, not bound)
    shown = "127.0.0.1" if everywhere else host
    if public:
        return RoutesPlace(routes_port, public.rstrip("/"))
    where = f"{WILDCARD}.{domain.strip('.')}" if domain else shown
    return RoutesPlace(routes_port, f"{scheme}://{where}:{routes_port}")


def place_of(app: Any) -> RoutesPlace:
    place: RoutesPlace = app.state.routes_place
    return place


# The routes listener.


class RoutesOrigin:
    """The app of the routes listener: routes, and nothing else."""

    def __init__(self, proxy: ASGIApp, place: Callable[[], RoutesPlace]) -> None:
        self.proxy = proxy
        self.place = place

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return
        place = self.place()
        path = scope.get("raw_path") or scope["path"].encode()
        named = passing.route_name(path)
        if place.wildcard:
            host = passing.headers(scope).get("host", "")
            own = place.host_name(host)
            if own is not None and path == b"/":
                await _say(scope, send, 308, "", [(b"location", f"/routes/{own}/".encode())])
                return
            if named is not None and own != named:
                where = f"route {named} lives at {place.address(named)}"
                await _say(scope, send, 404, f"not here: {where}")
                return
        if named is None:
            await _say(scope, send, 404, "this address serves routes only, at /routes/NAME/")
            return
        await self.proxy(scope, receive, send)


class Split:
    """One server, two listeners: what arrives on the routes port goes to the routes' origin
    app, the rest (and the lifespan) to the UI's and API's app. Decided by the socket a request
    came in on, never by a header the caller writes."""

    def __init__(self, main: ASGIApp, routes: ASGIApp, routes_port: int) -> None:
        self.main = main
        self.routes = routes
        self.routes_port = routes_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server") or ("", 0)
        if scope["type"] != "lifespan" and server[1] == self.routes_port:
            await self.routes(scope, receive, send)
        else:
            await self.main(scope, receive, send)


# The UI's and API's origin: `/routes/...` sends browsers on.


class UiDoor:
    """Mounted at /routes on the UI's and API's app."""

    def __init__(self, hub: Hub, identities: Identities, keys: RouteKeys, app: Any) -> None:
        self.hub = hub
        self.identities = identities
        self.keys = keys
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        place = place_of(self.app)
        path = scope.get("raw_path") or scope["path"].encode()
        name = passing.route_name(path)
        if name is None:
            await _say(scope, send, 404, "no such route: a route's address is /routes/NAME/")
            return
        where = place.origin(name) + path.decode("latin-1")
        if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD"):
            await _say(
                scope, send, 404, f"routes are served on their own origin: {place.address(name)}"
            )
            return
        code = await run_in_threadpool(self._code, scope, name)
        query = passing.without_credentials(scope.get("query_string") or b"")
        if code:
            query = (query + "&" if query else "") + f"code={code}"
        location = where + (f"?{query}" if query else "")
        await _say(
            scope, send, 303, "the route is on its own origin", [(b"location", location.encode())]
        )

    def _code(self, scope: Scope, name: str) -> str | None:
        """A code for the signed-in browser, when it may open the route."""
        cookie = passing.cookies(passing.headers(scope)).get(SESSION_COOKIE, "")
        if not cookie or len(cookie) > 200:
            return None
        try:
            who = self.identities.from_session(cookie, False, None)
        except Refused:
            return None
        route = self.hub.route_info(name)
        if route is None or not may_open(who, who.team, route):
            return None
        return self.keys.mint(who, name, proof_of_session(self.identities, cookie))


async def _say(
    scope: Scope,
    send: Send,
    status: int,
    detail: str,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """An answer of the server's own, never cached (a redirect may carry a code); a WebSocket
    handshake is refused."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    await answer(send, status, detail, [(b"cache-control", b"no-store"), *(headers or [])])


# The API: a code for programs that open a route in a browser (`klique app open`).


class RouteCodeOut(BaseModel):
    url: str  # the route's address with the code: open it in a browser within expires_in_s
    expires_in_s: int


def codes_router() -> APIRouter:
    router = APIRouter(tags=["routes"])

    @router.post(f"{API}/routes/{{name}}/code", status_code=201)
    def route_code(
        name: str, request: Request, authorization: Annotated[str | None, Header()] = None
    ) -> RouteCodeOut:
        """A one-time code that opens route NAME in a browser as you: good once, for 60 s. For
        programs (a bearer token; a `read` token's code opens the route for reads only); a
        browser signed in to the UI opens `/routes/NAME/` there and is sent on with a code."""
        identities = identities_of(request.app)
        token = bearer(authorization)
        who = caller_of(identities, token)
        if who is None:
            raise HTTPException(401, UNKNOWN_CALLER)
        url = open_url(request.app, who, name, proof_of_token(identities, token))
        return RouteCodeOut(url=url, expires_in_s=int(CODE_TTL_S))

    return router


def open_url(app: Any, who: Caller, name: str, proof: Proof) -> str:
    hub: Hub = app.state.route_hub
    route = hub.route_info(name) if NAME_RE.fullmatch(name) else None
    if route is None:
        raise HTTPException(404, f"no route {name}; `klique app ls` lists your apps")
    if not may_open(who, who.team, route):
        raise HTTPException(403, f"route {name} is not open to {who.user}")
    keys: RouteKeys = app.state.route_keys
    return f"{place_of(app).address(name)}?code={keys.mint(who, name, proof)}"
