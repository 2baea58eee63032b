"""Task creation through the API on SQLite: how many per second, and whether it slows as the
queue grows.

- creates/s from 8 concurrent clients, each sending single `POST /tasks`, and beside it the
  same clients' rate of `GET /health` (the cheapest request: the ceiling of any request here);
- creates/s from 8 concurrent clients sending `POST /tasks/batch` of 500 tasks;
- the median time of one `POST /tasks` with an empty queue (the baseline), again after the
  single creates (about 1,400 queued), and again with 100,000 tasks queued (filled through
  batches; on a server without them, written straight into its database). Nothing ever runs:
  the one team's limit is 0, so every task stays queued and each creation still wakes a
  placement cycle over the whole queue.

Where a single create's time goes: the server's CPU time per request, with the same 8 clients,
for `GET /health` (the HTTP and framework floor), `GET /whoami` (plus finding the caller's
token) and `POST /tasks`; and the clients' own CPU time per request (they share the machine).

Last line: the figures, and `ratio_100k_to_empty` (create_ms_100k_queued / create_ms_empty).
"""

from __future__ import annotations

import json
import resource
import sqlite3
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from _common import cpu_seconds, klique_server, last_line

CLIENTS = 8
SINGLES = 150  # per client
BATCHES = 4  # per client
BATCH = 500
SAMPLES = 200  # sequential creates for each median
COST_REQUESTS = 100  # per client, for the CPU time per request
QUEUED = 100_000
FILL_BATCH = 5000
ESTATE = """
teams:
  bench: [admin]
resources:
  cpu:
    profile: {cpus: 1, memory: 100M, walltime: 10m, pools: [local]}
pools:
  local:
    kind: host
    slots: 1
policies:
  bench: {resources: [cpu], limit: {cpu: 0}}
"""
TASK = {"command": ["true"], "resource": "cpu", "name": "bench"}


def clients(api: httpx.Client) -> list[httpx.Client]:
    return [
        httpx.Client(base_url=api.base_url, headers=api.headers, timeout=120)
        for _ in range(CLIENTS)
    ]


def rate(api: httpx.Client, work: int, send: object) -> float:
    """Tasks per second when each of the clients sends `work` requests through `send`."""
    pool = clients(api)
    start = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as threads:
        made = sum(threads.map(lambda c: sum(send(c) for _ in range(work)), pool))  # type: ignore[operator]
    elapsed = time.perf_counter() - start
    for client in pool:
        client.close()
    return round(made / elapsed, 1)


def single(client: httpx.Client) -> int:
    answer = client.post("/tasks", json=TASK)
    assert answer.status_code == 201, answer.text
    return 1


def batch(client: httpx.Client) -> int:
    answer = client.post("/tasks/batch", json={"tasks": [TASK] * BATCH})
    assert answer.status_code == 201, answer.text
    return BATCH


def get(path: str) -> object:
    def send(client: httpx.Client) -> int:
        answer = client.get(path)
        assert answer.status_code == 200, answer.text
        return 1

    return send


def own_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def cpu_per_request(api: httpx.Client, home: Path) -> dict[str, float]:
    """The server's CPU milliseconds per request of each kind, and the clients' own."""
    server = int((home / "bench-server.pid").read_text())
    costs: dict[str, float] = {}
    clients_s = 0.0
    for name, send in (("health", get("/health")), ("whoami", get("/whoami")), ("create", single)):
        server_before, own_before = cpu_seconds(server), own_cpu_s()
        rate(api, COST_REQUESTS, send)
        made = CLIENTS * COST_REQUESTS
        costs[name] = round((cpu_seconds(server) - server_before) / made * 1000, 2)
        clients_s += own_cpu_s() - own_before
    costs["clients"] = round(clients_s / (3 * CLIENTS * COST_REQUESTS) * 1000, 2)
    return costs


def median_create_ms(api: httpx.Client) -> float:
    times = []
    for _ in range(SAMPLES):
        start = time.perf_counter()
        single(api)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 2)


def queued(home: Path) -> int:
    with sqlite3.connect(home / "klique.db") as db:
        return int(db.execute("SELECT count(*) FROM tasks WHERE state = 'queued'").fetchone()[0])


def fill(api: httpx.Client, home: Path) -> str:
    """Queue tasks up to QUEUED: through batches, or straight into the database."""
    probe = api.post("/tasks/batch", json={"tasks": [TASK]})
    if probe.status_code == 201:
        while (missing := QUEUED - queued(home)) > 0:
            answer = api.post("/tasks/batch", json={"tasks": [TASK] * min(missing, FILL_BATCH)})
            assert answer.status_code == 201, answer.text
        return "batches"
    # A server without batches: the same rows, as its own store writes them.
    now = time.time()
    spec = json.dumps({"command": ["true"], "resource": "cpu", "name": "bench"})
    row = {
        **dict.fromkeys(("name", "project", "resource", "state", "spec", "team", "owner")),
        "reason": "", "diff": "", "diff_bytes": 0, "gpus": 0.0, "gpu_ids": "[]", "borrowed": 0,
        "preempted": 0, "skip_pools": "[]", "attempts": 0, "report_digest": "", "origin": "pool",
        "parameters": "{}", "packages": "[]", "inputs": "[]",
        "created_at": now, "updated_at": now, "queued_at": now,
    }  # fmt: skip
    row.update(name="bench", project="default", resource="cpu", state="queued", spec=spec)
    row.update(team="bench", owner="admin")
    columns = ", ".join(row)
    marks = ", ".join("?" for _ in row)
    with sqlite3.connect(home / "klique.db", timeout=60) as db:
        db.executemany(
            f"INSERT INTO tasks ({columns}) VALUES ({marks})",  # noqa: S608 (fixed names)
            [tuple(row.values())] * (QUEUED - queued(home)),
        )
    return "database"


def settle(api: httpx.Client, cycles: int = 3) -> None:
    """Wait until the scheduler has run a few cycles over the queue as it is now."""
    first = api.get("/health").json()["cycles"]
    while api.get("/health").json()["cycles"] < first + cycles:
        time.sleep(0.2)


def main() -> None:
    with klique_server(ESTATE) as (api, home):
        settle(api)
        empty_ms = median_create_ms(api)
        print(f"one create, empty queue      {empty_ms:8.2f} ms (median of {SAMPLES})", flush=True)
        singles = rate(api, SINGLES, single)
        print(f"{CLIENTS} clients, single creates {singles:8.1f} tasks/s", flush=True)
        ceiling = rate(api, SINGLES, get("/health"))
        print(f"{CLIENTS} clients, GET /health    {ceiling:8.1f} requests/s", flush=True)
        costs = cpu_per_request(api, home)
        print(f"CPU ms per request (server; clients): {costs}", flush=True)
        settle(api)
        some_ms = median_create_ms(api)
        some = queued(home)
        print(f"one create, {some} queued     {some_ms:8.2f} ms (median of {SAMPLES})", flush=True)
        has_batches = api.post("/tasks/batch", json={"tasks": [TASK]}).status_code == 201
        batches = rate(api, BATCHES, batch) if has_batches else None
        print(f"{CLIENTS} clients, batches of {BATCH} {batches} tasks/s", flush=True)
        start = time.perf_counter()
        how = fill(api, home)
        print(f"queued {queued(home)} ({how}) in {time.perf_counter() - start:.1f} s", flush=True)
        settle(api)
        full_ms = median_create_ms(api)
        print(f"one create, {QUEUED} queued {full_ms:8.2f} ms (median of {SAMPLES})", flush=True)
    last_line(
        {
            "creates_per_s": singles,
            "batch_creates_per_s": batches,
            "health_per_s": ceiling,
            "create_ms_empty": empty_ms,
            "create_ms_1k_queued": some_ms,
            "create_ms_100k_queued": full_ms,
            "ratio_100k_to_empty": round(full_ms / empty_ms, 2),
            "cpu_ms_per_request": costs,
            "clients": CLIENTS,
            "batch": BATCH,
        }
    )


if __name__ == "__main__":
    main()
