"""A route's app pushes 1 GiB to a caller that stops reading for a while: the server's RSS
through the push (it should stay within about 20 MiB of where it started), beside the same
transfer read promptly, and a 1 GiB upload, in MiB/s. `route_flood.py 256` moves 256 MiB."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from _common import klique_server, last_line

MiB = 1024 * 1024
BLOCK = 64 * 1024
PUSH = int(sys.argv[1] if len(sys.argv) > 1 else 1024) * MiB  # `route_flood.py [MiB]`
STALL_S = 10.0  # how long the slow caller reads nothing
# A server run as root runs no task as root: its host pool runs the admin's tasks as alice.
ESTATE = """
resources:
  cpu: {{profile: {{cpus: 1, memory: 400M, walltime: 30m, pools: [local]}}}}
pools:
  local:
    kind: host
    slots: 2
    user_map: {{admin: alice}}
    job_root: {job_root}
apps: {{catalogue: {catalogue}}}
limits: {{max_request: 2048}}
"""
ENDPOINT = {
    "kind": "endpoint",
    "form": {"type": "object", "properties": {"command": {"type": "array"}}},
    "command": ["{command}"],
}
# GET /push/N: N blocks of 64 KiB (block i is its number, 8 bytes, repeated), counting what its
# socket took; GET /: that count; POST: reads its body and answers its length and SHA-256.
FLOOD_APP = r"""
import hashlib, http.server, json, sys
port = int(sys.argv[1])
pushed = [0]
class App(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
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
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), App).serve_forever()
"""


def block(i: int) -> bytes:
    return i.to_bytes(8, "big") * (BLOCK // 8)


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise SystemExit(f"no VmRSS for process {pid}")


@contextmanager
def rss_samples(pid: int) -> Iterator[list[int]]:
    """The process's RSS every 50 ms while the block runs."""
    samples = [rss(pid)]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            samples.append(rss(pid))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join(5)


class Route:
    def __init__(self, url: str, path: str, token: str) -> None:
        self.url, self.path, self.token = url, path, token

    def pushed(self) -> int:
        answer = httpx.get(
            self.url + self.path, headers={"Authorization": f"Bearer {self.token}"}, timeout=60
        )
        if answer.status_code != 200:
            raise SystemExit(f"the route answered {answer.status_code}: {answer.text}")
        return int(answer.json()["pushed"])

    def request(self, head: str) -> socket.socket:
        where = urlsplit(self.url)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        sock.connect((where.hostname, where.port))
        sock.sendall(
            f"{head}\r\nHost: {where.netloc}\r\nAuthorization: Bearer {self.token}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        return sock


def read_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(BLOCK)
        if not piece:
            raise SystemExit(f"the answer ended in its head: {data!r}")
        data += piece
    head, _, rest = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"the route answered {head!r}")
    return rest


def read_rest(sock: socket.socket, got: bytes, total: int) -> str:
    digest, size = hashlib.sha256(got), len(got)
    while size < total:
        piece = sock.recv(MiB)
        if not piece:
            raise SystemExit(f"the answer ended after {size} of {total} bytes")
        digest.update(piece)
        size += len(piece)
    return digest.hexdigest()


def expected_sha256(blocks: int) -> str:
    digest = hashlib.sha256()
    for i in range(blocks):
        digest.update(block(i))
    return digest.hexdigest()


def prompt_push(route: Route, pid: int) -> dict[str, Any]:
    """Baseline: the same push, read as fast as it comes."""
    blocks = PUSH // BLOCK
    start = rss(pid)
    t0 = time.perf_counter()
    with rss_samples(pid) as samples:
        sock = route.request(f"GET {route.path}push/{blocks} HTTP/1.1")
        read_rest(sock, read_head(sock), PUSH)
        sock.close()
    seconds = time.perf_counter() - t0
    return {"mib_s": round(PUSH / MiB / seconds, 1), "growth_mib": mib(max(samples) - start)}


def stalled_push(route: Route, pid: int, expected: str) -> dict[str, Any]:
    """The attack: read the head and a little, then nothing for STALL_S, then the rest."""
    blocks = PUSH // BLOCK
    before = route.pushed()  # the app counts every push it has served
    start = rss(pid)
    t0 = time.perf_counter()
    with rss_samples(pid) as samples:
        sock = route.request(f"GET {route.path}push/{blocks} HTTP/1.1")
        got = read_head(sock)
        time.sleep(STALL_S)
        during_stall = route.pushed() - before
        print(f"after {STALL_S:g} s unread: the app has pushed {mib(during_stall)} MiB", flush=True)
        digest = read_rest(sock, got, PUSH)
        sock.close()
    if digest != expected:
        raise SystemExit("the caller's bytes differ from the app's")
    return {
        "rss_start_mib": mib(start),
        "rss_peak_mib": mib(max(samples)),
        "growth_mib": mib(max(samples) - start),
        "bytes_pushed": PUSH,
        "seconds": round(time.perf_counter() - t0, 1),
        "stall_s": STALL_S,
        "pushed_during_stall_mib": mib(during_stall),
    }


def upload(route: Route, pid: int, expected: str) -> dict[str, Any]:
    """The other way: a 1 GiB POST, sent as fast as the route takes it."""
    blocks = PUSH // BLOCK
    start = rss(pid)
    t0 = time.perf_counter()
    with rss_samples(pid) as samples:
        sock = route.request(f"POST {route.path}upload HTTP/1.1\r\nContent-Length: {PUSH}")
        for i in range(blocks):
            sock.sendall(block(i))
        rest = read_head(sock)
        while piece := sock.recv(BLOCK):
            rest += piece
        sock.close()
    seconds = time.perf_counter() - t0
    if json.loads(rest) != {"received": PUSH, "sha256": expected}:
        raise SystemExit(f"the app received otherwise: {rest!r}")
    return {"mib_s": round(PUSH / MiB / seconds, 1), "growth_mib": mib(max(samples) - start)}


def mib(n: int) -> float:
    return round(n / MiB, 1)


def routes_url(home: Path, api_url: str) -> str:
    """Where the server serves routes: their own origin (`routes` in its server.json) where it
    has one, else the API's."""
    found = json.loads((home / "server.json").read_text()).get("routes")
    return str(found).rstrip("/") if found else api_url


def launch(api: httpx.Client, python: str) -> dict[str, Any]:
    command = [python, "-c", FLOOD_APP, "{port}"]
    task = api.post("/apps/http/launch", json={"params": {"command": command}}).json()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = api.get(f"/apps/instances/{task['id']}").json()
        if found["ready"]:
            return dict(task)
        if found["state"] in ("failed", "cancelled", "lost", "completed", "timeout"):
            raise SystemExit(f"the app ended: {found}")
        time.sleep(0.2)
    raise SystemExit("the app did not answer through its route within 120 s")


def main() -> None:
    python = "/usr/bin/python3" if os.geteuid() == 0 else sys.executable
    expected = expected_sha256(PUSH // BLOCK)
    with tempfile.TemporaryDirectory(prefix="klique-flood-") as scratch:
        os.chmod(scratch, 0o755)  # the job root inside is entered by the mapped account
        job_root, catalogue = Path(scratch) / "jobs", Path(scratch) / "catalogue"
        job_root.mkdir()
        job_root.chmod(0o1777)
        catalogue.mkdir()
        (catalogue / "http.yaml").write_text(json.dumps(ENDPOINT))
        estate = ESTATE.format(job_root=job_root, catalogue=catalogue)
        with klique_server(estate) as (api, home):
            pid = int((home / "bench-server.pid").read_text())
            task = launch(api, python)
            url = routes_url(home, str(api.base_url).rstrip("/").removesuffix("/api/v1"))
            token = api.headers["Authorization"].removeprefix("Bearer ")
            route = Route(url, task["path"], token)
            route.pushed()  # the route served once: its code is loaded before the start
            baseline = prompt_push(route, pid)
            print(f"baseline, read promptly: {baseline}", flush=True)
            result = stalled_push(route, pid, expected)
            print(f"stalled: {result}", flush=True)
            uploaded = upload(route, pid, expected)
            print(f"upload: {uploaded}", flush=True)
            api.post(f"/apps/instances/{task['id']}/stop")
    result.update(
        {
            "baseline_download_mib_s": baseline["mib_s"],
            "baseline_download_growth_mib": baseline["growth_mib"],
            "upload_mib_s": uploaded["mib_s"],
            "upload_growth_mib": uploaded["growth_mib"],
        }
    )
    last_line(result)


if __name__ == "__main__":
    main()
