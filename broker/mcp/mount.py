"""`/mcp` on the API's app, built at its first request: the MCP SDK takes about a second of CPU
to import, which a server that no agent talks to never pays. Its sessions then live as long as
the app."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException

MCP_PATHS = ("/mcp", "/.well-known/oauth-protected-resource")

Scope = MutableMapping[str, Any]
ASGI = Callable[[Scope, Any, Any], Awaitable[None]]


def mount_mcp(app: FastAPI, public_url: str | None = None) -> None:
    """Serve /mcp and its metadata on the API's app; any other unknown path stays the API's
    JSON 404."""
    public = (public_url or os.environ.get("KLIQUE_PUBLIC_URL") or "").rstrip("/")
    mcp = LazyMcp(app, public or "http://127.0.0.1:8765")
    app.mount("", mcp.dispatch, name="mcp")
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(application: Any) -> AsyncIterator[Any]:
        try:
            async with inner(application) as state:
                yield state
        finally:
            await mcp.close()

    app.router.lifespan_context = lifespan


class LazyMcp:
    """The MCP server's Starlette app, made once, when first asked for."""

    def __init__(self, app: FastAPI, public_url: str) -> None:
        self.app = app
        self.public_url = public_url
        self._served: ASGI | None = None
        self._making = asyncio.Lock()
        self._stop = asyncio.Event()
        self._sessions: asyncio.Task[None] | None = None

    async def dispatch(self, scope: Scope, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if any(path == p or path.startswith(p + "/") for p in MCP_PATHS):
            await (await self._app())(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            # The app's handlers answer: JSON to the API's callers, a page to a browser.
            raise HTTPException(404)

    async def _app(self) -> ASGI:
        async with self._making:
            if self._served is None:
                server, served = await asyncio.to_thread(self._make)
                ready = asyncio.Event()
                self._sessions = asyncio.create_task(self._run(server, ready))
                await ready.wait()
                if self._sessions.done():  # the session manager failed to start
                    self._sessions.result()
                self._served = served
        return self._served

    def _make(self) -> tuple[Any, ASGI]:
        # Here, not at the top: the MCP SDK costs a second of CPU to import (module docstring).
        from mcp.server.transport_security import TransportSecuritySettings

        from broker.mcp.server import build_mcp  # lazily: it imports the MCP SDK

        server = build_mcp(self.app, self.public_url)
        # Bearer tokens are not sent by browsers on their own, so DNS rebinding gains nothing.
        served = server.streamable_http_app(
            streamable_http_path="/mcp",
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        return server, served

    async def _run(self, server: Any, ready: asyncio.Event) -> None:
        try:
            async with server.session_manager.run():
                ready.set()
                await self._stop.wait()
        finally:
            ready.set()

    async def close(self) -> None:
        self._stop.set()
        if self._sessions is not None:
            await self._sessions
