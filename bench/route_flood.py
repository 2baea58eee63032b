"""A route's app pushes 1 GiB to a caller that stops reading for a while: the server's RSS
through the push (it should stay within about 20 MiB of where it started), beside the same
transfer read promptly, and a 1 GiB upload, in MiB/s. `route_flood.py 256` moves 256 MiB."""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]

import httpx  # noqa: E402
from _common import klique_server, last_line  # noqa: E402
from helpers.flood import (  # noqa: E402
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


class Route:
    def __init__(self, url: str, path: str, token: str) -> None:
        self.url, self.path, self.token = url, path, token

    def pushed(self) -> int:
        return pushed_so_far(self.url + self.path, self.token)

    def request(self, head: str) -> socket.socket:
        return raw_request(self.url, head, self.token)


def read_ok(sock: socket.socket) -> bytes:
    """What came after the head of a 200 answer."""
    head, rest = read_head(sock)
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"the route answered {head!r}")
    return rest


def prompt_push(route: Route, pid: int) -> dict[str, Any]:
    """Baseline: the same push, read as fast as it comes."""
    blocks = PUSH // BLOCK
    start = rss(pid)
    t0 = time.perf_counter()
    with rss_peak(pid) as peak:
        sock = route.request(f"GET {route.path}push/{blocks} HTTP/1.1")
        read_body(sock, read_ok(sock), PUSH)
        sock.close()
    seconds = time.perf_counter() - t0
    return {"mib_s": round(PUSH / MiB / seconds, 1), "growth_mib": mib(peak() - start)}


def stalled_push(route: Route, pid: int, expected: str) -> dict[str, Any]:
    """The attack: read the head and a little, then nothing for STALL_S, then the rest."""
    blocks = PUSH // BLOCK
    before = route.pushed()  # the app counts every push it has served
    start = rss(pid)
    t0 = time.perf_counter()
    with rss_peak(pid) as peak:
        sock = route.request(f"GET {route.path}push/{blocks} HTTP/1.1")
        got = read_ok(sock)
        time.sleep(STALL_S)
        during_stall = route.pushed() - before
        print(f"after {STALL_S:g} s unread: the app has pushed {mib(during_stall)} MiB", flush=True)
        digest = read_body(sock, got, PUSH)
        sock.close()
    if digest != expected:
        raise SystemExit("the caller's bytes differ from the app's")
    return {
        "rss_start_mib": mib(start),
        "rss_peak_mib": mib(peak()),
        "growth_mib": mib(peak() - start),
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
    with rss_peak(pid) as peak:
        sock = route.request(f"POST {route.path}upload HTTP/1.1\r\nContent-Length: {PUSH}")
        for i in range(blocks):
            sock.sendall(block(i))
        rest = read_to_end(sock, read_ok(sock))
        sock.close()
    seconds = time.perf_counter() - t0
    if json.loads(rest) != {"received": PUSH, "sha256": expected}:
        raise SystemExit(f"the app received otherwise: {rest!r}")
    return {"mib_s": round(PUSH / MiB / seconds, 1), "growth_mib": mib(peak() - start)}


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
        job_root = Path(scratch) / "jobs"
        job_root.mkdir()
        job_root.chmod(0o1777)
        catalogue = http_catalogue(Path(scratch) / "catalogue")
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
    try:
        main()
    except ConnectionError as e:  # the route or the app broke off
        raise SystemExit(str(e)) from None
