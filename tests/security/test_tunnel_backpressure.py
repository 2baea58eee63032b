"""A route's tunnel holds at most a window of each stream's data (inside_job/frames.py): an app
that sends to a caller who does not read is slowed down, never held in the server's memory; a
large upload streams to the app; a runner that sends past its window loses the stream."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import websockets.sync.client
from app_helpers import launch, stop, wait_ready
from conftest import HOST_ACCESS, TASK_PY, Server, wait_for
from websockets.exceptions import ConnectionClosed

from inside_job import frames

MiB = 1024 * 1024
BLOCK = 64 * 1024
PUSH = 256 * MiB
GROWTH_BOUND = 64 * MiB  # of the server's RSS, for a 256 MiB transfer (the window is 256 KiB)

ESTATE = (
    "teams:\n  vision: [alice]\n"
    "resources:\n  cpu:\n    profile: {cpus: 1, memory: 400M, walltime: 10m, pools: [p]}\n"
    f"pools:\n  p:\n    kind: host\n    slots: 4\n    {HOST_ACCESS}\n"
    "apps: {catalogue: $CATALOGUE}\n"
    "limits: {max_request: 1024}\n"  # MiB: the site lets a route take a large upload
)

# The app: GET /push/N sends N blocks (block i is its number, 8 bytes, repeated), counting what
# its socket took; a WebSocket to /ws/N sends them as N binary messages; GET / tells that
# count; POST reads its body and answers its length and SHA-256.
FLOOD_APP = r"""
import base64, hashlib, http.server, json, struct, sys
port = int(sys.argv[1])
pushed = [0]
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
class App(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/ws/"):
            key = self.headers["Sec-WebSocket-Key"].encode() + GUID
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            accept = base64.b64encode(hashlib.sha1(key).digest()).decode()
            self.send_header("Sec-WebSocket-Accept", accept)
            self.end_headers()
            for i in range(int(self.path.rsplit("/", 1)[1])):
                self.wfile.write(b"\x82\x7f" + struct.pack(">Q", 65536))
                self.wfile.write(i.to_bytes(8, "big") * 8192)
                pushed[0] += 65536
            self.wfile.write(b"\x88\x02\x03\xe8")
            self.close_connection = True
            return
        if self.path.startswith("/push/"):
            blocks = int(self.path.rsplit("/", 1)[1])
            self.send_response(200)
            self.send_header("Content-Length", str(blocks * 65536))
            self.end_headers()
            for i in range(blocks):
                self.wfile.write(i.to_bytes(8, "big") * 8192)
                pushed[0] += 65536
            return
        self._json({"pushed": pushed[0]})
    def do_POST(self):
        left = int(self.headers["Content-Length"])
        digest, received = hashlib.sha256(), 0
        while left:
            piece = self.rfile.read(min(65536, left))
            if not piece:
                break
            digest.update(piece)
            received += len(piece)
            left -= len(piece)
        self._json({"received": received, "sha256": digest.hexdigest()})
    def _json(self, doc):
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), App).serve_forever()
"""


def block(i: int) -> bytes:
    return i.to_bytes(8, "big") * (BLOCK // 8)


def expected_sha256(blocks: int) -> str:
    digest = hashlib.sha256()
    for i in range(blocks):
        digest.update(block(i))
    return digest.hexdigest()


@pytest.fixture
def routes(server_factory, tmp_path: Path):
    """A server whose catalogue has the `http` endpoint (any command), and alice's token."""
    catalogue = tmp_path / "catalogue"
    catalogue.mkdir()
    endpoint = {
        "kind": "endpoint",
        "form": {"type": "object", "properties": {"command": {"type": "array"}}},
        "command": ["{command}"],
    }
    (catalogue / "http.yaml").write_text(json.dumps(endpoint))
    server = server_factory(ESTATE.replace("$CATALOGUE", str(catalogue)))
    return server, server.make_token("alice")


def rss(pid: int) -> int:
    """The process's resident memory, in bytes (/proc/PID/status, VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


@contextmanager
def rss_peak(pid: int) -> Iterator[Callable[[], int]]:
    """Samples the process's RSS every 50 ms; yields a function giving the peak so far."""
    peak = [rss(pid)]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], rss(pid))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield lambda: peak[0]
    finally:
        done.set()
        thread.join(5)


def routes_url(server: Server) -> str:
    """Where the server serves routes: their own origin where it has one, else the API's."""
    return getattr(server, "routes_url", "") or server.url


def raw_request(server: Server, head: str, token: str) -> socket.socket:
    """A plain socket to the server's routes with a request's head sent, its receive buffer
    small (a caller that reads nothing then holds little in its own kernel)."""
    where = urlsplit(routes_url(server))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.connect((where.hostname, where.port))
    sock.sendall(
        f"{head}\r\nHost: {where.netloc}\r\nAuthorization: Bearer {token}\r\n"
        "Connection: close\r\n\r\n".encode()
    )
    return sock


def read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """The response's head, and what came after it."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        assert piece, data
        data += piece
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def pushed(server: Server, path: str, token: str) -> int:
    """How much of its push the app's socket has taken, asked through the same route (the
    tunnel's other streams go on while one is stalled)."""
    url = routes_url(server) + path
    answer = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return int(answer.json()["pushed"])


def settled(read: Callable[[], int], still_s: float = 2.0, timeout: float = 120) -> int:
    """The value of `read()` once it has not changed for `still_s` seconds."""
    seen = [read(), time.monotonic()]

    def still() -> bool:
        now = read()
        if now != seen[0]:
            seen[:] = [now, time.monotonic()]
        return time.monotonic() - seen[1] >= still_s

    wait_for(still, timeout, "the app's push to settle", 0.25)
    return int(seen[0])


def launch_flood(server: Server, token: str) -> dict:
    command = [TASK_PY, "-c", FLOOD_APP, "{port}"]
    task = launch(server, token, "http", params={"command": command})
    wait_ready(server, token, task["id"])
    return task


def test_an_app_pushing_to_a_caller_that_does_not_read_is_slowed_not_buffered(routes) -> None:
    server, alice = routes
    task = launch_flood(server, alice)
    path = task["path"]
    blocks = PUSH // BLOCK
    assert pushed(server, path, alice) == 0  # and the server has served a route once
    start = rss(server.process.pid)
    sock = raw_request(server, f"GET {path}push/{blocks} HTTP/1.1", alice)
    try:
        with rss_peak(server.process.pid) as peak:
            head, rest = read_head(sock)
            assert head.startswith(b"HTTP/1.1 200"), head
            # The caller reads nothing more: the app's writes stall, far short of its push.
            stalled = settled(lambda: pushed(server, path, alice))
            assert stalled < GROWTH_BOUND, f"the app pushed {stalled} bytes to nobody"
            assert peak() - start < GROWTH_BOUND
            # Now it reads: every byte comes, in order, and the app finishes its push.
            digest, got = hashlib.sha256(rest), len(rest)
            while got < PUSH:
                piece = sock.recv(1024 * 1024)
                assert piece, f"the answer ended after {got} bytes"
                digest.update(piece)
                got += len(piece)
        growth = peak() - start
    finally:
        sock.close()
    assert got == PUSH and digest.hexdigest() == expected_sha256(blocks)
    assert pushed(server, path, alice) == PUSH
    assert growth < GROWTH_BOUND, f"the server grew by {growth / MiB:.0f} MiB"
    stop(server, alice, task["id"])


def test_a_large_upload_streams_to_the_app_in_bounded_memory(routes) -> None:
    server, alice = routes
    task = launch_flood(server, alice)
    blocks = PUSH // BLOCK
    pushed(server, task["path"], alice)
    start = rss(server.process.pid)
    head = f"POST {task['path']}upload HTTP/1.1\r\nContent-Length: {PUSH}"
    sock = raw_request(server, head, alice)
    try:
        with rss_peak(server.process.pid) as peak:
            for i in range(blocks):
                sock.sendall(block(i))
            head_bytes, rest = read_head(sock)
            growth = peak() - start
        while True:
            piece = sock.recv(65536)
            if not piece:
                break
            rest += piece
    finally:
        sock.close()
    assert head_bytes.startswith(b"HTTP/1.1 200"), head_bytes
    assert json.loads(rest) == {"received": PUSH, "sha256": expected_sha256(blocks)}
    assert growth < GROWTH_BOUND, f"the server grew by {growth / MiB:.0f} MiB"
    stop(server, alice, task["id"])


def ws_request(server: Server, path: str, token: str) -> socket.socket:
    """A plain socket that opens a WebSocket on the route (then reads only when told to)."""
    where = urlsplit(routes_url(server))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.connect((where.hostname, where.port))
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: {where.netloc}\r\nAuthorization: Bearer {token}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".encode()
    )
    return sock


def read_exactly(sock: socket.socket, n: int, buffered: bytearray) -> bytes:
    while len(buffered) < n:
        piece = sock.recv(1024 * 1024)
        assert piece, "the WebSocket ended early"
        buffered += piece
    data = bytes(buffered[:n])
    del buffered[:n]
    return data


def read_message(sock: socket.socket, buffered: bytearray) -> tuple[int, bytes]:
    """One unfragmented frame from the server (unmasked): its opcode and payload."""
    first, second = read_exactly(sock, 2, buffered)
    size = second & 0x7F
    if size == 126:
        size = int.from_bytes(read_exactly(sock, 2, buffered), "big")
    elif size == 127:
        size = int.from_bytes(read_exactly(sock, 8, buffered), "big")
    return first & 0x0F, read_exactly(sock, size, buffered)


def test_an_app_sending_websocket_messages_to_a_caller_that_does_not_read_is_slowed(
    routes,
) -> None:
    server, alice = routes
    task = launch_flood(server, alice)
    path = task["path"]
    messages = PUSH // BLOCK
    assert pushed(server, path, alice) == 0
    start = rss(server.process.pid)
    sock = ws_request(server, f"{path}ws/{messages}", alice)
    try:
        with rss_peak(server.process.pid) as peak:
            head, rest = read_head(sock)
            assert head.startswith(b"HTTP/1.1 101"), head
            stalled = settled(lambda: pushed(server, path, alice))  # the caller reads nothing
            assert stalled < GROWTH_BOUND, f"the app pushed {stalled} bytes to nobody"
            buffered = bytearray(rest)
            for i in range(messages):  # then every message comes, in order
                assert read_message(sock, buffered) == (0x2, block(i)), f"message {i}"
            growth = peak() - start
    finally:
        sock.close()
    assert pushed(server, path, alice) == PUSH
    assert growth < GROWTH_BOUND, f"the server grew by {growth / MiB:.0f} MiB"
    stop(server, alice, task["id"])


def _report_token(server: Server, task_id: int, token: str) -> str:
    job_dir = Path(server.task(task_id, token)["job_dir"])
    return str(json.loads((job_dir / "task.json").read_text())["report"]["token"])


@contextmanager
def fake_runner(server: Server, token: str, task_id: int) -> Iterator[object]:
    """A tunnel opened with the task's own report token, as a runner would."""
    url = server.url.replace("http://", "ws://") + f"/api/v1/tasks/{task_id}/tunnel"
    with websockets.sync.client.connect(
        url, additional_headers={"Authorization": f"Bearer {token}"}, max_size=None
    ) as connection:
        yield connection


def launch_silent(server: Server, alice: str) -> dict:
    """An app that never answers its ready path: its own runner's tunnel never says READY."""
    command = [TASK_PY, "-c", "import sys, time; time.sleep(600)", "{port}"]
    task = launch(server, alice, "http", params={"command": command})
    server.wait_state(task["id"], {"running"}, token=alice)
    return task


def next_frame(connection, kinds: set[int], timeout: float = 30) -> tuple[int, int, bytes]:
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no frame of kinds {sorted(kinds)} within {timeout} s"
        stream, kind, payload = frames.decode(connection.recv(timeout=left))
        if kind in kinds:
            return stream, kind, payload


def test_a_runner_that_ignores_its_window_loses_the_stream(routes) -> None:
    server, alice = routes
    task = launch_silent(server, alice)
    report = _report_token(server, task["id"], alice)
    with fake_runner(server, report, task["id"]) as runner:
        runner.send(frames.encode_json(0, frames.READY, {"version": frames.VERSION}))
        sock = raw_request(server, f"GET {task['path']}flood HTTP/1.1", alice)
        try:
            stream, _, _ = next_frame(runner, {frames.REQUEST})
            runner.send(frames.encode_json(stream, frames.RESPONSE, {"status": 200}))
            # 32 MiB without waiting for credit, to a caller that reads nothing.
            piece = b"z" * BLOCK
            for _ in range(32 * MiB // BLOCK):
                runner.send(frames.encode(stream, frames.BODY, piece))
            closed, kind, payload = next_frame(runner, {frames.CLOSE})
        finally:
            sock.close()
    assert closed == stream
    doc = frames.payload_json(payload)
    assert doc == {"code": 1008, "reason": "the app sent past the stream's window"}
    stop(server, alice, task["id"])


def test_a_runner_without_flow_control_is_turned_away(routes) -> None:
    server, alice = routes
    task = launch_silent(server, alice)
    report = _report_token(server, task["id"], alice)
    with fake_runner(server, report, task["id"]) as runner:
        runner.send(frames.encode(0, frames.READY))  # a runner from before WINDOW
        with pytest.raises(ConnectionClosed) as closed:
            runner.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert "older than the server" in closed.value.rcvd.reason
    stop(server, alice, task["id"])
