"""The server's one ASGI app, composed: the request layer's parts that hold for every request
(who is calling, the body limit, the status of each Klique error), then the adapters, each
mounted by its own package and none knowing another: the REST API, the route proxy's parts on
this origin, the web UI and its error pages, and MCP (broker/server.py serves it)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from broker.api.artifacts import streams_itself
from broker.api.health import health_router, install_store_unavailable
from broker.api.mount import OPENAPI, mount_api
from broker.control.loop import ControlLoop
from broker.http.errors import install_error_statuses
from broker.http.limits import BodyLimit
from broker.identity.resolve import Identities
from broker.mcp.mount import mount_mcp
from broker.metrics import Sources, mount_metrics
from broker.route_proxy.mount import mount_routes
from broker.web.site import mount_web


def create_app(
    control: ControlLoop, lifespan: Any = None, public_url: str | None = None
) -> FastAPI:
    """The app over the control loop `control`; `public_url` is where MCP's clients reach
    the server."""
    app = FastAPI(lifespan=lifespan, **OPENAPI)
    app.state.control = control
    # Every adapter finds its callers through it (broker/http/callers.py, identities_of).
    app.state.identities = Identities(control.store, lambda: control.estate)
    app.add_middleware(
        BodyLimit,
        limit=lambda: control.estate.limits.max_request_bytes,
        skip=streams_itself,  # artifact uploads stream their body and enforce their own limit
    )
    install_error_statuses(app)
    # Every replica answers its load balancer, unauthenticated (broker/api/health.py).
    app.include_router(health_router(control))
    install_store_unavailable(app)
    # Order matters: paths are matched in the order they are added, and MCP's mount, which
    # takes every path no one else did, comes last; the web UI's error pages replace the
    # plain answer for browsers' requests for pages.
    mount_api(app, control, app.state.identities)
    mount_routes(app)
    mount_web(app, control)
    # Read at each scrape from their owners: the store, the agents' snapshots, the route hub.
    tunnels = lambda: len(app.state.route_hub.instances)  # noqa: E731
    mount_metrics(app, Sources(control.store.counts, control.snapshots, tunnels), control.home)
    mount_mcp(app, public_url)
    return app
