"""The route proxy, mounted at /routes: `/routes/NAME/...` over HTTP and WebSocket to the apps
behind the route, through their tunnels.

Each request: the route's name is read from the raw path (a name that is not a plain name is
not found); the caller is authenticated (broker/routes/auth.py) and must be permitted; the
request goes to the route's next ready instance with hop-by-hop headers, the caller's Klique
token and cookie, and any forwarding headers they sent removed, and the server's own forwarding
headers added. An idempotent request whose instance went away before answering is sent to the
next one; a route with no ready instance waits for one up to the switch-over window.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

from broker.api.auth import SAFE, Caller, needed_scope, scope_problem
from broker.identity.resolve import Identities
from broker.names import NAME
from broker.routes import headers as passing
from broker.routes.auth import RouteInfo, cookie_header, may_open, route_caller
from broker.routes.hub import SWITCH_WINDOW_S, Hub, Instance, InstanceGone
from inside_job import frames

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

PREFIX = b"/routes/"
_NAME = re.compile(NAME.encode())
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
CHUNK = 64 * 1024


class Refusal(Exception):
    """A request the route answers itself, with a status and one sentence."""

    def __init__(
        self, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers or []


class Target:
    """A request's route and what the app is asked for."""

    def __init__(self, scope: Scope) -> None:
        raw = scope.get("raw_path") or scope["path"].encode()
        if not raw.startswith(PREFIX):
            raise Refusal(404, "not a route")
        name, slash, tail = raw[len(PREFIX) :].partition(b"/")
        if not _NAME.fullmatch(name):
            raise Refusal(404, "no such route: a route's name is letters, digits, '.', '_', '-'")
        self.name = name.decode()
        self.slash = bool(slash)
        self.raw = raw
        self.tail = b"/" + tail
        self.query = scope.get("query_string") or b""

    def upstream(self, path_mode: str) -> str:
        path = self.raw if path_mode == "keep" else self.tail
        target = path + (b"?" + self.query if self.query else b"")
        return target.decode("latin-1")


class RouteProxy:
    def __init__(self, hub: Hub, identities: Identities) -> None:
        self.hub = hub
        self.identities = identities

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.http(scope, receive, send)
        elif scope["type"] == "websocket":
            await self.websocket(scope, receive, send)

    # Who, and may they.

    def _admit(self, scope: Scope, target: Target) -> tuple[Caller, RouteInfo, str]:
        headers = passing.headers(scope)
        caller, how = route_caller(self.identities, headers, passing.cookies(headers))
        route = self.hub.route_info(target.name)
        if caller is None:
            raise Refusal(
                401,
                "a route needs your Klique token: send it as `Authorization: Bearer TOKEN`, or "
                f"open /routes/{target.name}/?token=TOKEN once in a browser",
                [(b"www-authenticate", b"Bearer")],
            )
        if route is None:
            raise Refusal(404, f"no route {target.name}; `klique app ls` lists your apps")
        if not may_open(caller, caller.team, route):
            raise Refusal(403, f"route {target.name} is not open to {caller.user}")
        needed = needed_scope(scope["method"]) if scope["type"] == "http" else "submit"
        problem = scope_problem(caller, needed)
        if problem:
            raise Refusal(403, problem)
        return caller, route, how

    # HTTP.

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            target = Target(scope)
            if not target.slash:
                location = target.raw + b"/" + (b"?" + target.query if target.query else b"")
                await _answer(
                    send, 308, "the route's address ends with /", [(b"location", location)]
                )
                return
            if await self._handshake(scope, target, send):
                return
            caller, route, how = self._admit(scope, target)
            if (
                how == "cookie"
                and scope["method"] not in SAFE
                and passing.cross_site(passing.headers(scope), scope)
            ):
                raise Refusal(403, "a cross-site request to a route is refused")
            await self._forward(scope, receive, send, target, caller, route)
        except Refusal as exc:
            await _answer(send, exc.status, exc.detail, exc.headers)

    async def _handshake(self, scope: Scope, target: Target, send: Send) -> bool:
        """`?token=TOKEN`: checked, kept in the route's cookie, and dropped from the address."""
        pairs = parse_qsl(target.query.decode("latin-1"), keep_blank_values=True)
        tokens = [v for k, v in pairs if k == "token"]
        if not tokens:
            return False
        scope = {**scope, "headers": [(b"authorization", f"Bearer {tokens[0]}".encode())]}
        self._admit(scope, target)
        rest = urlencode([(k, v) for k, v in pairs if k != "token"])
        location = target.raw + (b"?" + rest.encode() if rest else b"")
        secure = scope.get("scheme") == "https"
        cookie = cookie_header(tokens[0], target.name, secure).encode()
        await _answer(
            send, 303, "signed in to the route", [(b"location", location), (b"set-cookie", cookie)]
        )
        return True

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        target: Target,
        caller: Caller,
        route: RouteInfo,
    ) -> None:
        body = await _read_body(receive)
        method = scope["method"]
        deadline = time.monotonic() + SWITCH_WINDOW_S
        tried: set[int] = set()
        while True:
            instance = await self.hub.pick(target.name, deadline, tried)
            if instance is None:
                raise Refusal(
                    503,
                    f"no instance of route {target.name} is ready; `klique app ls` shows its "
                    "apps (one that is starting answers once it is up)",
                )
            head = {
                "method": method,
                "target": target.upstream(instance.path),
                "headers": passing.upstream_headers(scope, target.name, caller),
            }
            stream, inbox = instance.open_stream()
            try:
                status, headers = await _request(instance, stream, inbox, head, body)
            except InstanceGone as exc:
                instance.close_stream(stream)
                if method in IDEMPOTENT:
                    tried.add(instance.task_id)
                    continue
                raise Refusal(502, f"the app behind route {target.name} failed: {exc}") from None
            try:
                await _relay(send, inbox, status, headers, _sandboxed(caller, route))
            finally:
                instance.close_stream(stream)
            return

    # WebSocket.

    async def websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        connect = await receive()
        if connect["type"] != "websocket.connect":
            return
        try:
            target = Target(scope)
            caller, route, _ = self._admit(scope, target)
            if passing.cross_site(passing.headers(scope), scope):
                raise Refusal(403, "a cross-site WebSocket to a route is refused")
        except Refusal:
            await send({"type": "websocket.close", "code": 1008})
            return
        instance = await self.hub.pick(target.name, time.monotonic() + SWITCH_WINDOW_S)
        if instance is None:
            await send({"type": "websocket.close", "code": 1013})  # try again later
            return
        stream, inbox = instance.open_stream()
        try:
            await self._bridge(scope, receive, send, target, caller, instance, stream, inbox)
        finally:
            instance.close_stream(stream)

    async def _bridge(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        target: Target,
        caller: Caller,
        instance: Instance,
        stream: int,
        inbox: asyncio.Queue[tuple[int, bytes]],
    ) -> None:
        opened = {
            "target": target.upstream(instance.path),
            "headers": passing.upstream_headers(scope, target.name, caller),
            "subprotocols": list(scope.get("subprotocols") or []),
        }
        await instance.send(frames.encode_json(stream, frames.WS_OPEN, opened))
        kind, payload = await inbox.get()
        if kind != frames.WS_ACCEPTED:
            await send({"type": "websocket.close", "code": 1011})
            return
        accepted = frames.payload_json(payload).get("subprotocol")
        await send({"type": "websocket.accept", "subprotocol": accepted})
        upward = asyncio.create_task(_client_to_app(receive, instance, stream))
        try:
            await _app_to_client(send, inbox)
        finally:
            upward.cancel()


async def _client_to_app(receive: Receive, instance: Instance, stream: int) -> None:
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            close = {"code": int(message.get("code") or 1000), "reason": ""}
            await instance.send(frames.encode_json(stream, frames.CLOSE, close))
            return
        if message.get("text") is not None:
            await instance.send(frames.encode(stream, frames.WS_TEXT, message["text"].encode()))
        elif message.get("bytes") is not None:
            await instance.send(frames.encode(stream, frames.WS_BINARY, message["bytes"]))


async def _app_to_client(send: Send, inbox: asyncio.Queue[tuple[int, bytes]]) -> None:
    while True:
        kind, payload = await inbox.get()
        if kind == frames.WS_TEXT:
            await send({"type": "websocket.send", "text": payload.decode("utf-8", "replace")})
        elif kind == frames.WS_BINARY:
            await send({"type": "websocket.send", "bytes": payload})
        elif kind == frames.CLOSE:
            code = _close_code(payload)
            await send({"type": "websocket.close", "code": code})
            return


def _close_code(payload: bytes) -> int:
    try:
        code = int(frames.payload_json(payload).get("code") or 1000)
    except (ValueError, TypeError):
        return 1011
    return code if 1000 <= code < 5000 and code not in (1005, 1006, 1015) else 1011


async def _request(
    instance: Instance,
    stream: int,
    inbox: asyncio.Queue[tuple[int, bytes]],
    head: dict[str, Any],
    body: bytes,
) -> tuple[int, list[list[str]]]:
    """Send the request down the tunnel; the app's status and headers, or InstanceGone."""
    try:
        await instance.send(frames.encode_json(stream, frames.REQUEST, head))
        for start in range(0, len(body), CHUNK):
            await instance.send(frames.encode(stream, frames.BODY, body[start : start + CHUNK]))
        await instance.send(frames.encode(stream, frames.END))
    except (OSError, RuntimeError) as exc:  # the tunnel's socket went away
        raise InstanceGone(str(exc)) from exc
    kind, payload = await inbox.get()
    if kind != frames.RESPONSE:
        reason = frames.payload_json(payload).get("reason") if payload else ""
        raise InstanceGone(str(reason or "no answer"))
    doc = frames.payload_json(payload)
    return int(doc["status"]), list(doc.get("headers") or [])


async def _relay(
    send: Send,
    inbox: asyncio.Queue[tuple[int, bytes]],
    status: int,
    headers: list[list[str]],
    sandbox: bool,
) -> None:
    out = [
        (str(n).lower().encode("latin-1"), str(v).encode("latin-1"))
        for n, v in headers
        if str(n).lower() not in passing.DROPPED_BACK and not passing.our_cookie(str(n), str(v))
    ]
    if sandbox:
        out.append((b"content-security-policy", passing.SANDBOX))
    await send({"type": "http.response.start", "status": status, "headers": out})
    while True:
        kind, payload = await inbox.get()
        if kind == frames.BODY:
            await send({"type": "http.response.body", "body": payload, "more_body": True})
        elif kind in (frames.END, frames.CLOSE):
            # A body cut short by the app's end is ended here; its declared length tells.
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return


def _sandboxed(caller: Caller, route: RouteInfo) -> bool:
    return not (route.kind == "session" and caller.user in route.owners)


async def _read_body(receive: Receive) -> bytes:
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return bytes(body)
        body += message.get("body", b"")
        if not message.get("more_body"):
            return bytes(body)


async def _answer(
    send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
