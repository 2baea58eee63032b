"""The request-size limit: a body over the estate's `limits.max_request` is refused with 413
before any handler reads it, whether it says its length or streams in chunks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.http.asgi import Message, Receive, Scope, Send, answer


class BodyLimit:
    def __init__(
        self, app: Any, limit: Callable[[], int], skip: Callable[[Scope], bool] | None = None
    ) -> None:
        self.app = app
        self.limit = limit
        self.skip = skip  # routes that stream their body and enforce their own limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.skip is not None and self.skip(scope)):
            await self.app(scope, receive, send)
            return
        limit = self.limit()
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await answer(send, 400, "the Content-Length header is not a number")
                return
            if int(declared) > limit:
                await answer(send, 413, _too_large(int(declared), limit))
                return
            await self.app(scope, receive, send)
            return
        # No declared length (chunked): read up to the limit here, then hand the body on.
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message], receive), send)
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limit:
                await answer(send, 413, _too_large(len(body), limit, at_least=True))
                return
        replay = {"type": "http.request", "body": bytes(body), "more_body": False}
        await self.app(scope, _replay([replay], receive), send)


def _too_large(size: int, limit: int, at_least: bool = False) -> str:
    return (
        f"the request body is {'over ' if at_least else ''}{size} bytes, over this server's "
        f"limit of {limit} bytes; fix: send less (commit large changes, ignore large files), or "
        "ask the platform team to raise limits.max_request in the estate"
    )


def _replay(messages: list[Message], then: Receive) -> Receive:
    """Messages already read, then the connection's own (a disconnect, later)."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await then()

    return replayed
