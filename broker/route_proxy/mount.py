"""The route proxy's parts on the server's app: the tunnel endpoint, the route hub, the codes
that open routes in a browser, and the door at /routes that sends browsers on to the routes'
origin."""

from __future__ import annotations

from fastapi import FastAPI

from broker.config import DEFAULT_PORT
from broker.route_proxy.access import RouteKeys
from broker.route_proxy.hub import Hub
from broker.route_proxy.origin import UiDoor, codes_router, routes_place
from broker.route_proxy.proxy import RouteProxy
from broker.route_proxy.tunnel import router

ROUTES = "/routes"


def mount_routes(app: FastAPI) -> None:
    """On the server's app: the tunnel endpoint, the route hub, the codes that open routes in a
    browser, and at /routes the door that sends browsers on to the routes' origin. The proxy
    itself is `app.state.route_proxy`, which the routes listener serves (broker/server.py)."""
    hub = Hub(app.state.control)
    keys = RouteKeys()
    app.state.route_hub = hub
    app.state.route_keys = keys
    # Where routes live until the server says (`klique server` sets it from its options).
    app.state.routes_place = routes_place("127.0.0.1", DEFAULT_PORT, DEFAULT_PORT + 1, None)
    app.state.route_proxy = RouteProxy(
        hub, app.state.identities, keys, lambda: app.state.routes_place.wildcard
    )
    app.include_router(router)
    app.include_router(codes_router())
    app.mount(ROUTES, UiDoor(hub, app.state.identities, keys, app), name="routes")
