"""What the control plane shows operators at `/metrics`, in Prometheus' text format
(prometheus-client): tasks by state and pool, the scheduler cycle's time, each pool's health,
the time of its last good answer and its status queries, the API's latency by route template,
and the route tunnels open. docs/operations.md names every metric and the alerts built on them.

Nothing here is per user: labels are states, pools (the estate's), route templates, methods and
status classes, so a scrape names no user and no task, and no caller can grow the number of
series. Counts are read from their owners at scrape time (the store, the agents' snapshots, the
route hub), never kept twice by hand. A leaf module: the control loop imports its histogram,
and the app hands it what it reads.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker.execution import PoolState

PATH = "/metrics"
# A file in the server's home: when present, a scrape must show the token it holds.
TOKEN_FILE = "metrics.token"  # noqa: S105 (a file's name, not a secret)

# One placement cycle: its reads, the pure placement and the writes of what it decided.
CYCLE_SECONDS = Histogram(
    "klique_scheduler_cycle_seconds",
    "Time one scheduler cycle took: reading the queue, placing, writing its decisions.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=None,  # registered in each app's own registry (`registry` below)
)

# Time to the response's headers: an event stream or a long download does not stretch it.
REQUEST_SECONDS = Histogram(
    "klique_http_request_duration_seconds",
    "Time from a request's arrival to its response's headers, by route template.",
    ["method", "route", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=None,
)

# The states of a task that waits for a place or a start (broker/domain.py's names).
WAITING = frozenset({"queued", "held", "placed", "submitted", "pending"})
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"  # a path no route serves: never the path itself (callers choose it)


@dataclass(frozen=True)
class Sources:
    """Where a scrape reads what it shows, each at the time of the scrape."""

    # (state, pool, count, when the longest-waiting of them first queued)
    task_counts: Callable[[], Iterable[tuple[str, str | None, int, float | None]]]
    pools: Callable[[], Mapping[str, PoolState]]  # each pool's latest snapshot
    tunnels: Callable[[], int]  # route tunnels open to this server


class EstateCollector:
    """The estate's gauges and the agents' counters, read from their owners at each scrape."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        yield from self._tasks()
        yield from self._pools(self.sources.pools())
        tunnels = GaugeMetricFamily("klique_route_tunnels", "Route tunnels open to this server.")
        tunnels.add_metric([], self.sources.tunnels())
        yield tunnels

    def _tasks(self) -> Iterator[Metric]:
        tasks = GaugeMetricFamily(
            "klique_tasks",
            "Tasks by state and pool (pool empty: not placed).",
            labels=["state", "pool"],
        )
        oldest = GaugeMetricFamily(
            "klique_tasks_oldest_queued_timestamp_seconds",
            "When the longest-waiting task of a waiting state and pool first queued (Unix time).",
            labels=["state", "pool"],
        )
        for state, pool, count, queued_at in self.sources.task_counts():
            tasks.add_metric([state, pool or ""], count)
            if state in WAITING and queued_at is not None:
                oldest.add_metric([state, pool or ""], queued_at)
        yield from (tasks, oldest)

    def _pools(self, pools: Mapping[str, PoolState]) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "klique_pool_up", "1 while the pool answers its agent, else 0.", labels=["pool"]
        )
        last_good = GaugeMetricFamily(
            "klique_pool_last_good_answer_timestamp_seconds",
            "When the pool last answered its agent well (Unix time).",
            labels=["pool"],
        )
        queries = CounterMetricFamily(
            "klique_pool_status_queries",
            "Status queries (squeue, qstat, bjobs...) the pool's agent has made since it started.",
            labels=["pool"],
        )
        looks = CounterMetricFamily(
            "klique_pool_looks",
            "Looks the pool's agent has taken at the pool since it started.",
            labels=["pool"],
        )
        for name, state in sorted(pools.items()):
            up.add_metric([name], 1 if state.reachable else 0)
            if state.last_good is not None:
                last_good.add_metric([name], state.last_good)
            queries.add_metric([name], state.status_queries)
            looks.add_metric([name], state.looks)
        yield from (up, last_good, queries, looks)


def registry(sources: Sources) -> CollectorRegistry:
    """One app's registry: its estate, the cycle and request histograms, and this process's
    CPU and memory (process_cpu_seconds_total, process_resident_memory_bytes)."""
    found = CollectorRegistry(auto_describe=False)
    found.register(EstateCollector(sources))
    found.register(CYCLE_SECONDS)
    found.register(REQUEST_SECONDS)
    found.register(ProcessCollector(registry=None))
    return found


def route_label(scope: Scope, root: str) -> str:
    """The template of the route that served a request (`/api/v1/tasks/{task_id}`), with the
    prefixes of the mounts it passed; `unmatched` when none did."""
    route = scope.get("route")
    template = getattr(route, "path", None)
    if not isinstance(template, str):
        return UNMATCHED
    mounted = str(scope.get("root_path", ""))[len(root) :]
    return (mounted + template) or "/"


def status_class(status: int) -> str:
    return f"{status // 100}xx"


class RequestTimes:
    """ASGI middleware: each HTTP request's time to its response's headers, by method, route
    template and status class (a bounded set of label values, whatever callers send)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        root = str(scope.get("root_path", ""))
        observed = False

        async def timed(message: Message) -> None:
            nonlocal observed
            if message["type"] == "http.response.start" and not observed:
                observed = True
                method = scope["method"] if scope["method"] in METHODS else "OTHER"
                REQUEST_SECONDS.labels(
                    method, route_label(scope, root), status_class(message["status"])
                ).observe(time.perf_counter() - started)
            await send(message)

        await self.app(scope, receive, timed)


def may_scrape(home: Path, authorization: str | None) -> bool:
    """Open unless the server's home holds `metrics.token`; then only with it as a bearer
    token (Prometheus' `authorization: credentials_file`). Read at each scrape: a new token
    takes effect without a restart."""
    try:
        expected = (home / TOKEN_FILE).read_text().strip()
    except FileNotFoundError:
        return True
    scheme, _, given = (authorization or "").partition(" ")
    return (
        bool(expected)
        and scheme.lower() == "bearer"
        and hmac.compare_digest(given.strip().encode(), expected.encode())
    )


def endpoint(found: CollectorRegistry, home: Path) -> Callable[[Request], Any]:
    """The `/metrics` handler: the registry rendered off the event loop (the store's counts
    are a query)."""

    async def metrics(request: Request) -> Response:
        if not may_scrape(home, request.headers.get("authorization")):
            return PlainTextResponse(
                f"/metrics asks for the bearer token in {home / TOKEN_FILE}; fix: give it "
                "with Authorization: Bearer (Prometheus: authorization.credentials_file)",
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        body = await asyncio.to_thread(generate_latest, found)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return metrics


def mount_metrics(app: Starlette, sources: Sources, home: Path) -> None:
    """On the server's app: the request timer around every route, and `/metrics` (before any
    mount that takes every path)."""
    app.add_middleware(RequestTimes)
    app.add_route(PATH, endpoint(registry(sources), home), include_in_schema=False)
