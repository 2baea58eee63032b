"""A route's tunnel holds at most a window of each stream's data (inside_job/frames.py): an app
that sends to a caller who does not read is slowed down, never held in the server's memory; a
large upload streams to the app; a runner that sends past its window loses the stream."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import websockets.sync.client
from conftest import HOST_ACCESS, TASK_PY, Server, wait_for
from helpers.app import launch, stop, wait_ready
from helpers.flood import (
    BLOCK,
    FLOOD_APP,
    MiB,
    block,
    expected_sha256,
    http_catalogue,
    pushed_so_far,
    raw_request,
    read_body,
    read_head,
    read_to_end,
    rss,
    rss_peak,
)
from websockets.exceptions import ConnectionClosed

from inside_job import frames

PUSH = 256 * MiB
GROWTH_BOUND = 64 * MiB  # of the server's RSS, for a 256 MiB transfer (the window is 256 KiB)

ESTATE = (
    "teams:\n  vision: [alice]\n"
    "resources:\n  cpu:\n    profile: {cpus: 1, memory: 400M, walltime: 10m, pools: [p]}\n"
    f"pools:\n  p:\n    kind: host\n    slots: 4\n    {HOST_ACCESS}\n"
    "apps: {catalogue: $CATALOGUE}\n"
    "limits: {max_request: 1024}\n"  # MiB: the site lets a route take a large upload
)


@pytest.fixture
def routes(server_factory, tmp_path: Path):
    """A server whose catalogue has the `http` endpoint (any command), and alice's token."""
    catalogue = http_catalogue(tmp_path / "catalogue")
    server = server_factory(ESTATE.replace("$CATALOGUE", str(catalogue)))
    return server, server.make_token("alice")


def routes_url(server: Server) -> str:
    """Where the server serves routes: their own origin where it has one, else the API's."""
    return getattr(server, "routes_url", "") or server.url


def pushed(server: Server, path: str, token: str) -> int:
    """How much of its push the app's socket has taken, asked through the same route."""
    return pushed_so_far(routes_url(server) + path, token)


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
    sock = raw_request(routes_url(server), f"GET {path}push/{blocks} HTTP/1.1", alice)
    try:
        with rss_peak(server.process.pid) as peak:
            head, rest = read_head(sock)
            assert head.startswith(b"HTTP/1.1 200"), head
            # The caller reads nothing more: the app's writes stall, far short of its push.
            stalled = settled(lambda: pushed(server, path, alice))
            assert stalled < GROWTH_BOUND, f"the app pushed {stalled} bytes to nobody"
            assert peak() - start < GROWTH_BOUND
            # Now it reads: every byte comes, in order, and the app finishes its push.
            digest = read_body(sock, rest, PUSH)
        growth = peak() - start
    finally:
        sock.close()
    assert digest == expected_sha256(blocks)
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
    sock = raw_request(routes_url(server), head, alice)
    try:
        with rss_peak(server.process.pid) as peak:
            for i in range(blocks):
                sock.sendall(block(i))
            head_bytes, rest = read_head(sock)
            growth = peak() - start
        rest = read_to_end(sock, rest)
    finally:
        sock.close()
    assert head_bytes.startswith(b"HTTP/1.1 200"), head_bytes
    assert json.loads(rest) == {"received": PUSH, "sha256": expected_sha256(blocks)}
    assert growth < GROWTH_BOUND, f"the server grew by {growth / MiB:.0f} MiB"
    stop(server, alice, task["id"])


def ws_request(server: Server, path: str, token: str) -> socket.socket:
    """A plain socket that opens a WebSocket on the route (then reads only when told to)."""
    opening = (
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="
    )
    return raw_request(routes_url(server), f"GET {path} HTTP/1.1", token, opening)


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
        sock = raw_request(routes_url(server), f"GET {task['path']}flood HTTP/1.1", alice)
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
