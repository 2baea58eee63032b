"""The runner's side of a route, in the standard library: its WebSocket client against a real
server (the `websockets` package), and its tunnel carrying HTTP requests and WebSocket streams
to an app on 127.0.0.1, as the server frames them (inside_job/frames.py)."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from conftest import wait_for
from websockets.asyncio.server import serve

from inside_job import frames, wsclient
from inside_job.tunnel import Tunnel


@contextmanager
def ws_server(handler) -> Iterator[tuple[int, asyncio.AbstractEventLoop]]:
    """A `websockets` server on loopback in its own thread; yields its port and loop."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop = asyncio.Event()
    port: list[int] = []

    async def main() -> None:
        async with serve(handler, "127.0.0.1", 0, max_size=None) as server:
            port.append(server.sockets[0].getsockname()[1])
            started.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield port[0], loop
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


async def echo(connection) -> None:
    await connection.ping()
    async for message in connection:
        if message == "close please":
            await connection.close(4001, "asked to")
            return
        await connection.send(message)


def test_the_client_speaks_rfc6455_to_a_real_server():
    with ws_server(echo) as (port, _):
        ws = wsclient.WebSocket.connect(f"ws://127.0.0.1:{port}/x")
        ws.send_text("héllo")
        assert ws.recv() == (wsclient.TEXT, "héllo".encode())
        big = bytes(range(256)) * 1000  # past 65535 bytes: a 64-bit length, masked
        ws.send_binary(big)
        assert ws.recv() == (wsclient.BINARY, big)
        ws.send_text("close please")
        with pytest.raises(wsclient.Closed) as closed:
            ws.recv()
        assert (closed.value.code, closed.value.reason) == (4001, "asked to")


def test_a_refused_handshake_says_its_status():
    refusal = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n"
    with socket_server(refusal) as port, pytest.raises(wsclient.HandshakeError) as err:
        wsclient.WebSocket.connect(f"ws://127.0.0.1:{port}/")
    assert err.value.status == 403


@contextmanager
def socket_server(answer: bytes) -> Iterator[int]:
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve_one() -> None:
        connection, _ = listener.accept()
        connection.recv(65536)
        connection.sendall(answer)
        connection.close()

    thread = threading.Thread(target=serve_one, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


class App(http.server.BaseHTTPRequestHandler):
    """The app on the node: it answers only with its secret, and says what it received."""

    def do_GET(self) -> None:
        if self.path == "/big":
            self.send_response(200)
            self.send_header("Content-Length", str(BIG))
            self.end_headers()
            self.wfile.write(b"b" * BIG)
            return
        self._answer(b"")

    def do_POST(self) -> None:
        self._answer(self.rfile.read(int(self.headers["Content-Length"])))

    def _answer(self, body: bytes) -> None:
        if self.headers.get("Authorization") != "Bearer s3cret":
            self.send_response(401)
            self.end_headers()
            return
        payload = json.dumps(
            {"path": self.path, "body": body.decode(), "host": self.headers["Host"]}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def app_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), App)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


def test_the_tunnel_carries_requests_to_the_app_with_its_secret():
    """A stand-in for the Klique server: it takes the tunnel, waits for READY, then sends a
    POST down it as the proxy does and reads the app's answer."""
    answers: list[dict] = []
    done = threading.Event()

    async def server_side(connection) -> None:
        assert connection.request.headers["Authorization"] == "Bearer report-token"
        stream, kind, _ = frames.decode(await connection.recv())
        assert (stream, kind) == (0, frames.READY)
        head = {
            "method": "POST",
            "target": "/v1/echo?q=1",
            "headers": [["X-A", "b"]],
            "length": 9,  # the caller's Content-Length, as the proxy passes it on
        }
        await connection.send(frames.encode_json(7, frames.REQUEST, head))
        await connection.send(frames.encode(7, frames.BODY, b"hello "))
        await connection.send(frames.encode(7, frames.BODY, b"app"))
        await connection.send(frames.encode(7, frames.END))
        body = b""
        while True:
            stream, kind, payload = frames.decode(await connection.recv())
            assert stream == 7
            if kind == frames.RESPONSE:
                answers.append(frames.payload_json(payload))
            elif kind == frames.BODY:
                body += payload
            elif kind == frames.END:
                answers.append(json.loads(body))
                done.set()
                await connection.wait_closed()
                return

    with app_server() as app_port, ws_server(server_side) as (port, _):
        tunnel = Tunnel(
            f"ws://127.0.0.1:{port}/api/v1/tasks/1/tunnel",
            "report-token",
            app_port,
            {"Authorization": "Bearer s3cret"},
            "/ready",
        )
        tunnel.start()
        try:
            assert done.wait(30), answers
        finally:
            tunnel.stop()
    head, seen = answers
    assert head["status"] == 200
    assert seen == {"path": "/v1/echo?q=1", "body": "hello app", "host": f"127.0.0.1:{app_port}"}


BIG = 4 * frames.WINDOW_BYTES


def test_the_runner_sends_an_answer_only_as_the_server_grants_credit():
    """A stand-in server that grants nothing gets one window of the app's answer, then the
    rest once it grants it."""
    seen: dict[str, int] = {}
    done = threading.Event()

    async def body_until_quiet(connection, stream: int) -> tuple[int, bool]:
        got, ended = 0, False
        while not ended:
            try:
                frame = await asyncio.wait_for(connection.recv(), 1.5)
            except TimeoutError:
                break
            found, kind, payload = frames.decode(frame)
            assert found == stream
            got += len(payload) if kind == frames.BODY else 0
            ended = kind == frames.END
        return got, ended

    async def server_side(connection) -> None:
        frames.decode(await connection.recv())  # READY
        head = {"method": "GET", "target": "/big", "headers": [], "length": 0}
        await connection.send(frames.encode_json(5, frames.REQUEST, head))
        await connection.send(frames.encode(5, frames.END))
        assert frames.decode(await connection.recv())[1] == frames.RESPONSE
        seen["before"], ended = await body_until_quiet(connection, 5)
        assert not ended
        await connection.send(frames.encode_window(5, seen["before"]))
        rest = BIG - seen["before"]
        while rest > 0:  # grant the rest as a caller that reads would, a window at a time
            got, ended = await body_until_quiet(connection, 5)
            seen["after"] = seen.get("after", 0) + got
            rest -= got
            if got:
                await connection.send(frames.encode_window(5, got))
            if ended or not got:
                break
        done.set()
        await connection.wait_closed()

    with app_server() as app_port, ws_server(server_side) as (port, _):
        tunnel = Tunnel(f"ws://127.0.0.1:{port}/t", "t", app_port, {}, "/big")
        tunnel.start()
        try:
            assert done.wait(60), seen
        finally:
            tunnel.stop()
    assert seen == {"before": frames.WINDOW_BYTES, "after": BIG - frames.WINDOW_BYTES}


def test_the_tunnel_carries_websocket_streams_both_ways():
    got: list[object] = []
    done = threading.Event()

    async def app_side(connection) -> None:
        assert connection.request.headers["Authorization"] == "Bearer s3cret"
        async for message in connection:
            await connection.send(f"app got {message}")

    grants: list[tuple[int, int]] = []

    async def next_frame(connection) -> tuple[int, int, bytes]:
        """The runner's next frame, its grants of credit (WINDOW) put aside."""
        while True:
            stream, kind, payload = frames.decode(await connection.recv())
            if kind != frames.WINDOW:
                return stream, kind, payload
            grants.append((stream, frames.window_increment(payload)))

    async def server_side(connection) -> None:
        _, _, ready = frames.decode(await connection.recv())
        assert frames.ready_version(ready) == frames.VERSION
        opened = {"target": "/ws", "headers": [], "subprotocols": []}
        await connection.send(frames.encode_json(3, frames.WS_OPEN, opened))
        stream, kind, payload = await next_frame(connection)
        got.append((stream, kind, frames.payload_json(payload)))
        await connection.send(frames.encode(3, frames.WS_TEXT, b"1+1"))
        stream, kind, payload = await next_frame(connection)
        got.append((stream, kind, payload))
        await connection.send(frames.encode_json(3, frames.CLOSE, {"code": 1000}))
        stream, kind, _ = await next_frame(connection)
        got.append((stream, kind))
        done.set()
        await connection.wait_closed()

    # The app's ready path is asked over plain HTTP: a WebSocket server answers 426, below 500.
    with ws_server(app_side) as (app_port, _), ws_server(server_side) as (port, _):
        tunnel = Tunnel(
            f"ws://127.0.0.1:{port}/t", "t", app_port, {"Authorization": "Bearer s3cret"}, "/"
        )
        tunnel.start()
        try:
            assert done.wait(30), got
        finally:
            tunnel.stop()
    assert got == [
        (3, frames.WS_ACCEPTED, {"subprotocol": None}),
        (3, frames.WS_TEXT, b"app got 1+1"),
        (3, frames.CLOSE),
    ]
    assert grants == [(3, 3)]  # "1+1" reached the app: its 3 bytes of credit come back


def test_a_tunnel_the_server_refuses_gives_up():
    with socket_server(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n") as port:
        tunnel = Tunnel(f"ws://127.0.0.1:{port}/t", "wrong", 1, {}, "/")
        tunnel.start()
        wait_for(lambda: not tunnel._thread.is_alive(), 30, "the tunnel to give up")
    assert not tunnel.ready.is_set()
