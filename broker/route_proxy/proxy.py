"""The route proxy, on the routes' own origin (broker/route_proxy/origin.py): `/routes/NAME/...`
over HTTP and WebSocket to the apps behind the route, through their tunnels.

Each request: the route's name is read from the raw path (a name that is not a plain name is
not found); a browser's one-time code is exchanged for the route's cookie; the caller is
authenticated (broker/route_proxy/access.py) and must be permitted; the request goes to the
route's next ready instance with hop-by-hop headers, the caller's Klique token and cookie, and
any forwarding headers they sent removed, and the server's own forwarding headers added; of the
app's answer, only the headers of an allow-list reach the caller
(broker/route_proxy/headers.py). An idempotent request whose instance went away before answering
is sent to the next one; a route with no ready instance waits for one up to the switch-over
window.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import parse_qsl

from broker.http.asgi import Receive, Scope, Send, answer
from broker.http.callers import SAFE, Caller, needed_scope, scope_problem
from broker.http.cookies import SESSION_COOKIE
from broker.identity.resolve import Identities, Refused
from broker.names import NAME
from broker.route_proxy import headers as passing
from broker.route_proxy.access import RouteInfo, RouteKeys, cookie_header, may_open, route_caller
from broker.route_proxy.hub import (
    SWITCH_WINDOW_S,
    Hub,
    Instance,
    InstanceGone,
    Stream,
    StreamsFull,
    close_payload,
)
from inside_job import frames

PREFIX = b"/routes/"
_NAME = re.compile(NAME.encode())
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
CHUNK = 64 * 1024


HOW_TO_OPEN = (
    "route {name} needs you signed in: open it from the web UI's Apps page, or run "
    "`klique app open {name}` and open the address it prints (programs send "
    "`Authorization: Bearer TOKEN`)"
)
ADDRESS_REFUSED = (
    "a token in a route's address is refused (a link must not carry a sign-in): open the route "
    "from the web UI's Apps page or with `klique app open {name}`; programs send "
    "`Authorization: Bearer TOKEN`"
)
OTHERS_CODE = (
    "this route code opens the route as {user}, and this browser is signed in as {holder}: "
    "a link to a route must not sign you in as someone else; ask {user} to share the app "
    "(an endpoint with your team) instead"
)
SPENT_CODE = (
    "this route code is unknown, used, or over a minute old: open route {name} again from the "
    "web UI's Apps page or with `klique app open {name}`"
)


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
    def __init__(
        self, hub: Hub, identities: Identities, keys: RouteKeys, own_hosts: Callable[[], bool]
    ) -> None:
        self.hub = hub
        self.identities = identities
        self.keys = keys
        self.own_hosts = own_hosts  # whether each route has a host of its own (a wildcard domain)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.http(scope, receive, send)
        elif scope["type"] == "websocket":
            await self.websocket(scope, receive, send)

    # Who, and may they.

    def _admit(self, scope: Scope, target: Target) -> tuple[Caller, RouteInfo, str]:
        headers = passing.headers(scope)
        cookies = passing.cookies(headers)
        caller, how = route_caller(self.identities, self.keys, target.name, headers, cookies)
        route = self.hub.route_info(target.name)
        if caller is None:
            raise Refusal(
                401, HOW_TO_OPEN.format(name=target.name), [(b"www-authenticate", b"Bearer")]
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
                await answer(
                    send, 308, "the route's address ends with /", [(b"location", location)]
                )
                return
            if await self._handshake(scope, target, send):
                return
            caller, route, how = self._admit(scope, target)
            if how == "cookie":
                self._same_route(scope, target)
            await self._forward(scope, receive, send, target, caller, route)
        except Refusal as exc:
            await answer(send, exc.status, exc.detail, exc.headers)

    def _same_route(self, scope: Scope, target: Target) -> None:
        """A request made with the route's cookie comes from the route's own pages, or from a
        top-level navigation: not from another site's page acting through the cookie, nor (when
        routes share one origin) from another route's page."""
        headers = passing.headers(scope)
        if scope["type"] == "http" and scope["method"] in SAFE:
            cross = False
        else:
            cross = passing.cross_site(headers, scope)
        if cross:
            raise Refusal(403, "a cross-site request to a route is refused")
        if not self.own_hosts() and passing.from_another_route(headers, target.name):
            raise Refusal(
                403,
                f"a request to route {target.name} from another route's page is refused "
                "(routes share one origin on this server; `klique server --routes-domain` gives "
                "each a host of its own)",
            )

    async def _handshake(self, scope: Scope, target: Target, send: Send) -> bool:
        """`?code=CODE`: exchanged, once, for a route session in the route's cookie, and dropped
        from the address. `?token=` is refused: a token in an address is kept by histories,
        logs and Referer headers, and a link carrying one signs its follower in as its sender."""
        pairs = parse_qsl(target.query.decode("latin-1"), keep_blank_values=True)
        if any(k == "token" for k, _ in pairs):
            raise Refusal(400, ADDRESS_REFUSED.format(name=target.name))
        codes = [v for k, v in pairs if k == "code"]
        if not codes:
            return False
        found = self.keys.spend(codes[0], target.name)
        if found is None:
            raise Refusal(401, SPENT_CODE.format(name=target.name))
        holder = self._browser_user(scope)
        if holder is not None and holder != found.caller.user:
            raise Refusal(403, OTHERS_CODE.format(user=found.caller.user, holder=holder))
        session = self.keys.start(found)
        rest = passing.without_credentials(target.query)
        location = target.raw + (b"?" + rest.encode() if rest else b"")
        secure = scope.get("scheme") == "https"
        cookie = cookie_header(session, target.name, secure).encode()
        signed = [(b"location", location), (b"set-cookie", cookie), (b"cache-control", b"no-store")]
        await answer(send, 303, "signed in to the route", signed)
        return True

    def _browser_user(self, scope: Scope) -> str | None:
        """Whom the browser is signed in to the UI as, when its session cookie reaches this
        origin (cookies keep to a host, not a port: routes on another port of the UI's host)."""
        cookie = passing.cookies(passing.headers(scope)).get(SESSION_COOKIE, "")
        if not cookie or len(cookie) > 200:
            return None
        try:
            return self.identities.from_session(cookie, False, None).user
        except Refused:
            return None

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        target: Target,
        caller: Caller,
        route: RouteInfo,
    ) -> None:
        body = RequestBody(receive, _declared_length(scope))
        try:
            await body.start()
        except CallerGone:
            return
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
                "length": body.length,  # None: chunked
            }
            stream = _open(instance, target)
            upload: asyncio.Task[None] | None = None
            try:
                try:
                    upload, (status, headers) = await _request(instance, stream, head, body)
                except InstanceGone as exc:
                    if body.gone:
                        return
                    if method in IDEMPOTENT and body.replayable:
                        tried.add(instance.task_id)
                        continue
                    raise Refusal(
                        502, f"the app behind route {target.name} failed: {exc}"
                    ) from None
                kept = passing.passed_back(headers, target.name, self.own_hosts())
                await _relay(send, instance, stream, status, kept, _sandboxed(caller, route))
            finally:
                if upload is not None:
                    upload.cancel()
                instance.close_stream(stream.id)
                if not stream.sent_end and not stream.closed:  # the app still reads a body
                    await _close_stream(instance, stream, "the answer ended before the body")
            return

    # WebSocket.

    async def websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        connect = await receive()
        if connect["type"] != "websocket.connect":
            return
        try:
            target = Target(scope)
            caller, route, how = self._admit(scope, target)
            if passing.cross_site(passing.headers(scope), scope):
                raise Refusal(403, "a cross-site WebSocket to a route is refused")
            if how == "cookie":
                self._same_route(scope, target)
        except Refusal:
            await send({"type": "websocket.close", "code": 1008})
            return
        instance = await self.hub.pick(target.name, time.monotonic() + SWITCH_WINDOW_S)
        if instance is None:
            await send({"type": "websocket.close", "code": 1013})  # try again later
            return
        try:
            stream = _open(instance, target)
        except Refusal:
            await send({"type": "websocket.close", "code": 1013})  # try again later
            return
        try:
            await self._bridge(scope, receive, send, target, caller, instance, stream)
        finally:
            instance.close_stream(stream.id)

    async def _bridge(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        target: Target,
        caller: Caller,
        instance: Instance,
        stream: Stream,
    ) -> None:
        opened = {
            "target": target.upstream(instance.path),
            "headers": passing.upstream_headers(scope, target.name, caller),
            "subprotocols": list(scope.get("subprotocols") or []),
        }
        await instance.send(frames.encode_json(stream.id, frames.WS_OPEN, opened))
        kind, payload = await stream.take()
        if kind != frames.WS_ACCEPTED:
            await send({"type": "websocket.close", "code": 1011})
            return
        accepted = frames.payload_json(payload).get("subprotocol")
        await send({"type": "websocket.accept", "subprotocol": accepted})
        upward = asyncio.create_task(_client_to_app(receive, instance, stream))
        try:
            await _app_to_client(send, instance, stream)
        finally:
            upward.cancel()


def _open(instance: Instance, target: Target) -> Stream:
    try:
        return instance.open_stream()
    except StreamsFull as exc:
        raise Refusal(
            503,
            f"route {target.name} is busy: {exc}; try again when some have finished",
            [(b"retry-after", b"1")],
        ) from None


async def _client_to_app(receive: Receive, instance: Instance, stream: Stream) -> None:
    """The caller's messages, each sent when the stream's window allows it: the next is read
    only then, so a caller faster than the app is slowed by its own connection."""
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            close = {"code": int(message.get("code") or 1000), "reason": ""}
            await instance.send(frames.encode_json(stream.id, frames.CLOSE, close))
            return
        try:
            if message.get("text") is not None:
                await instance.send_message(stream, frames.WS_TEXT, message["text"].encode())
            elif message.get("bytes") is not None:
                await instance.send_message(stream, frames.WS_BINARY, message["bytes"])
        except InstanceGone:
            return  # the app closed the stream: its CLOSE reaches the caller the other way


async def _app_to_client(send: Send, instance: Instance, stream: Stream) -> None:
    """The app's messages to the caller; each is granted back once the caller's connection took
    it, so an app faster than its caller waits for credit."""
    while True:
        kind, payload = await stream.take()
        if kind == frames.WS_TEXT:
            await send({"type": "websocket.send", "text": payload.decode("utf-8", "replace")})
        elif kind == frames.WS_BINARY:
            await send({"type": "websocket.send", "bytes": payload})
        elif kind == frames.CLOSE:
            code = _close_code(payload)
            await send({"type": "websocket.close", "code": code})
            return
        if kind in frames.DATA:
            await instance.passed_on(stream, len(payload))


def _close_code(payload: bytes) -> int:
    try:
        code = int(frames.payload_json(payload).get("code") or 1000)
    except (ValueError, TypeError):
        return 1011
    return code if 1000 <= code < 5000 and code not in (1005, 1006, 1015) else 1011


async def _request(
    instance: Instance, stream: Stream, head: dict[str, Any], body: RequestBody
) -> tuple[asyncio.Task[None], tuple[int, list[list[str]]]]:
    """Send the request down the tunnel, its body streaming beside (an app may answer before
    it has read all of it); the upload's task and the app's status and headers, or
    InstanceGone."""
    try:
        await instance.send(frames.encode_json(stream.id, frames.REQUEST, head))
    except (OSError, RuntimeError) as exc:  # the tunnel's socket went away
        raise InstanceGone(str(exc)) from exc
    upload = asyncio.create_task(_upload(instance, stream, body))
    try:
        kind, payload = await stream.take()
        try:
            doc = frames.payload_json(payload) if payload else {}
            if kind != frames.RESPONSE:
                raise InstanceGone(str(doc.get("reason") or "no answer"))
            return upload, (int(doc["status"]), list(doc.get("headers") or []))
        except (ValueError, KeyError, TypeError):  # not JSON, or no status: a broken runner
            raise InstanceGone("the app's runner answered out of turn") from None
    except BaseException:
        upload.cancel()
        raise


async def _upload(instance: Instance, stream: Stream, body: RequestBody) -> None:
    """The caller's body to the app as the window allows, then END; a caller gone before its
    end closes the stream. Then, until cancelled, watch for the caller going away, so that the
    app stops sending to nobody."""
    try:
        async for piece in body.pieces():
            await instance.send_body(stream, piece, CHUNK)
        await instance.send(frames.encode(stream.id, frames.END))
        stream.sent_end = True
        await body.disconnected()
    except CallerGone:
        await _close_stream(instance, stream, "the caller went away")
    except (InstanceGone, OSError, RuntimeError):
        return  # the answer's side sees the stream end


async def _close_stream(instance: Instance, stream: Stream, reason: str) -> None:
    """End the stream here and tell the runner, whose side may still be at work on it."""
    gone = close_payload(1001, reason)
    stream.end(gone)
    with contextlib.suppress(OSError, RuntimeError):
        await instance.send(frames.encode(stream.id, frames.CLOSE, gone))


async def _relay(
    send: Send,
    instance: Instance,
    stream: Stream,
    status: int,
    headers: list[tuple[bytes, bytes]],
    sandbox: bool,
) -> None:
    out = list(headers)  # passing.passed_back's
    if sandbox:
        out.append((b"content-security-policy", passing.SANDBOX))
    await send({"type": "http.response.start", "status": status, "headers": out})
    while True:
        kind, payload = await stream.take()
        if kind == frames.BODY:
            await send({"type": "http.response.body", "body": payload, "more_body": True})
            await instance.passed_on(stream, len(payload))  # the caller's socket took it
        elif kind in (frames.END, frames.CLOSE):
            # A body cut short by the app's end is ended here; its declared length tells.
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return


def _sandboxed(caller: Caller, route: RouteInfo) -> bool:
    """Every page but a session's, shown to its owner, gets an opaque origin (CSP sandbox)."""
    return not (route.kind == "session" and caller.user in route.owners)


class CallerGone(Exception):
    """The caller disconnected."""


def _declared_length(scope: Scope) -> int | None:
    """The body's length as the caller declared it: None for a chunked body, 0 for none."""
    found = dict(passing.headers(scope))
    if "transfer-encoding" in found:
        return None
    try:
        return int(found.get("content-length") or 0)
    except ValueError:
        return None


class RequestBody:
    """The caller's request body, streamed, never read whole: its first piece is kept, so the
    request can go to another instance until more of it has been read (`replayable`)."""

    def __init__(self, receive: Receive, length: int | None) -> None:
        self._receive = receive
        self.length = length
        self._first = b""
        self._more = True
        self.replayable = True
        self.gone = False  # the caller went away

    async def start(self) -> None:
        self._first = await self._next()

    async def pieces(self) -> AsyncIterator[bytes]:
        if self._first:
            yield self._first
        while self._more:
            self.replayable = False
            yield await self._next()

    async def _next(self) -> bytes:
        message = await self._receive()
        if message["type"] != "http.request":
            self._more = False
            self.gone = True
            raise CallerGone()
        self._more = bool(message.get("more_body"))
        return bytes(message.get("body", b""))

    async def disconnected(self) -> None:
        """Until the caller goes away (CallerGone)."""
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                raise CallerGone()
