"""A route's app that floods its caller, and a caller on a plain socket that reads when it
chooses, for the tunnel's back-pressure test and benchmark
(tests/security/test_tunnel_backpressure.py, bench/route_flood.py)."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx

MiB = 1024 * 1024
BLOCK = 64 * 1024

# The catalogue's `http` endpoint: it runs any command given in the launch's form.
HTTP_ENDPOINT = {
    "kind": "endpoint",
    "form": {"type": "object", "properties": {"command": {"type": "array"}}},
    "command": ["{command}"],
}

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


def http_catalogue(catalogue: Path) -> Path:
    """A catalogue folder holding the `http` endpoint."""
    catalogue.mkdir()
    (catalogue / "http.yaml").write_text(json.dumps(HTTP_ENDPOINT))
    return catalogue


def block(i: int) -> bytes:
    """The app's block number i."""
    return i.to_bytes(8, "big") * (BLOCK // 8)


def expected_sha256(blocks: int) -> str:
    """The SHA-256 of the app's first `blocks` blocks, one after the other."""
    digest = hashlib.sha256()
    for i in range(blocks):
        digest.update(block(i))
    return digest.hexdigest()


def rss(pid: int) -> int:
    """The process's resident memory, in bytes (/proc/PID/status, VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ProcessLookupError(f"no VmRSS for process {pid}")


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


def pushed_so_far(url: str, token: str) -> int:
    """How much of its push the app's socket has taken, asked at the app's `url` (the route's
    address): the tunnel's other streams go on while one is stalled."""
    answer = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    if answer.status_code != 200:
        raise ConnectionError(f"the route answered {answer.status_code}: {answer.text}")
    return int(answer.json()["pushed"])


def raw_request(
    routes_url: str, head: str, token: str, fields: str = "Connection: close"
) -> socket.socket:
    """A plain socket to the server's routes with a request's head sent (`head`, the host, the
    token, then `fields`), its receive buffer small: a caller that reads nothing then holds
    little in its own kernel."""
    where = urlsplit(routes_url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.connect((where.hostname, where.port))
    sock.sendall(
        f"{head}\r\nHost: {where.netloc}\r\nAuthorization: Bearer {token}\r\n"
        f"{fields}\r\n\r\n".encode()
    )
    return sock


def read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """The response's head, and what came after it."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(BLOCK)
        if not piece:
            raise ConnectionError(f"the answer ended in its head: {data!r}")
        data += piece
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def read_body(sock: socket.socket, got: bytes, size: int) -> str:
    """The SHA-256 of a body of `size` bytes whose start, `got`, came with the head."""
    digest, received = hashlib.sha256(got), len(got)
    while received < size:
        piece = sock.recv(MiB)
        if not piece:
            raise ConnectionError(f"the answer ended after {received} of {size} bytes")
        digest.update(piece)
        received += len(piece)
    return digest.hexdigest()


def read_to_end(sock: socket.socket, got: bytes) -> bytes:
    """`got` and all that comes after it, until the server closes the connection."""
    while piece := sock.recv(BLOCK):
        got += piece
    return got
