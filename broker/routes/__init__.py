"""Routes: `/routes/NAME/...` on the Klique server, an authenticated reverse proxy (HTTP and
WebSocket) to the apps behind them, reached through tunnels the runners open to the server."""

from __future__ import annotations

from fastapi import FastAPI

ROUTES = "/routes"


def mount_routes(app: FastAPI) -> None:
    """The tunnel endpoint, the route hub and the proxy, on the API's app."""
    from broker.routes.hub import Hub
    from broker.routes.proxy import RouteProxy
    from broker.routes.tunnel import router

    hub = Hub(app.state.scheduler)
    app.state.route_hub = hub
    app.include_router(router)
    app.mount(ROUTES, RouteProxy(hub, app.state.identities), name="routes")
