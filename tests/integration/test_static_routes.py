"""An `http` endpoint behind a static route: a client keeps calling the route while the
instance behind it is replaced and a second one added. No request fails outside the
switch-over window (a stopped instance finishes what it has in flight first; a request that
finds no ready instance waits for one), and both instances serve."""

from __future__ import annotations

import threading
import time

import httpx
from conftest import HOST_ACCESS, wait_for
from helpers.app import echo_command, launch, stop, wait_ready

ESTATE = (
    "teams:\n  vision: [alice]\n  nlp: [bob]\n"
    "resources:\n  cpu:\n    profile: {cpus: 1, memory: 1G, walltime: 1h, pools: [p]}\n"
    f"pools:\n  p:\n    kind: host\n    slots: 4\n    {HOST_ACCESS}\n"
)


class Caller(threading.Thread):
    """Calls the route again and again (bounded in time), noting when and what came back."""

    def __init__(self, url: str, token: str) -> None:
        super().__init__(daemon=True)
        self.url, self.token = url, token
        self.seen: list[tuple[float, int, str]] = []  # (time, status, instance or error)
        self.stop = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + 240
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(timeout=60, headers=headers) as http:
            while not self.stop.is_set() and time.monotonic() < deadline:
                try:
                    answer = http.get(self.url)
                    name = answer.json()["name"] if answer.status_code == 200 else answer.text
                    self.seen.append((time.monotonic(), answer.status_code, name))
                except httpx.HTTPError as exc:
                    self.seen.append((time.monotonic(), 0, repr(exc)))

    def names_since(self, since: float) -> set[str]:
        return {name for t, status, name in self.seen if t >= since and status == 200}


def test_a_static_route_switches_instances_without_failing_requests(server_factory):
    server = server_factory(ESTATE)
    alice, bob = server.make_token("alice"), server.make_token("bob")
    with server.api() as api:
        made = api.post("/routes", json={"name": "echo", "teams": ["vision"], "apps": ["http"]})
        assert made.status_code == 201, made.text
    with server.api(bob) as api:  # only the platform team makes routes
        assert api.post("/routes", json={"name": "mine"}).status_code == 403

    def endpoint(name: str) -> int:
        task = launch(server, alice, "http", route="echo", params={"command": echo_command(name)})
        assert task["path"] == "/routes/echo/" and task["static"]
        wait_ready(server, alice, task["id"])
        return int(task["id"])

    first = endpoint("first")
    caller = Caller(f"{server.routes_url}/routes/echo/", alice)
    caller.start()
    wait_for(lambda: caller.names_since(0) == {"first"}, 30, "the first instance to serve")

    second = endpoint("second")
    switch_started = time.monotonic()
    assert stop(server, alice, first)["state"] == "cancelled"
    switch_ended = time.monotonic()
    wait_for(lambda: "second" in caller.names_since(switch_ended), 30, "the second to serve")

    third = endpoint("third")
    added = time.monotonic()
    wait_for(
        lambda: caller.names_since(added) >= {"second", "third"},
        60,
        "both instances to serve the route",
    )
    caller.stop.set()
    caller.join(60)

    failures = [(t, status, what) for t, status, what in caller.seen if status != 200]
    outside = [f for f in failures if not switch_started <= f[0] <= switch_ended]
    assert outside == [], outside
    assert len(caller.seen) > 20
    assert "first" not in caller.names_since(switch_ended)
    with httpx.Client(base_url=server.routes_url) as http:  # the route is its teams' only
        refused = http.get("/routes/echo/", headers={"Authorization": f"Bearer {bob}"})
    assert refused.status_code == 403
    with server.api() as api:
        route = next(r for r in api.get("/routes").json() if r["name"] == "echo")
    assert route["ready"] == sorted([second, third])
    for task_id in (second, third):
        stop(server, alice, task_id)
