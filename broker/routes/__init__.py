"""Routes: `/routes/NAME/...`, an authenticated reverse proxy (HTTP and WebSocket) to the apps
behind them, reached through tunnels the runners open to the server. Served on an origin of
their own (broker/routes/origin.py), never the UI's and API's."""

from __future__ import annotations

from fastapi import FastAPI

from broker.config import DEFAULT_PORT

ROUTES = "/routes"


def mount_routes(app: FastAPI) -> None:
    """On the API's app: the tunnel endpoint, the route hub, the codes that open routes in a
    browser, and at /routes the door that sends browsers on to the routes' origin. The proxy
    itself is `app.state.route_proxy`, which the routes listener serves (broker/server.py)."""
    from broker.routes.auth import RouteKeys
    from broker.routes.hub import Hub
    from broker.routes.origin import UiDoor, codes_router, routes_place
    from broker.routes.proxy import RouteProxy
    from broker.routes.tunnel import router

    hub = Hub(app.state.scheduler)
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
