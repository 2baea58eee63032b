"""What an operator's Prometheus sees at /metrics, read with prometheus-client's own parser, and
the server's JSON logs (`--log-format json`): one server for the module, a task run on its host
pool."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from conftest import HOST_ESTATE, ROOT, Server, free_port, wait_for
from prometheus_client.parser import text_string_to_metric_families

# Every label name /metrics may carry: none of them holds a user's words.
BOUNDED_LABELS = {"state", "pool", "method", "route", "status", "le"}


@pytest.fixture(scope="module")
def server(module_server_factory: Callable[..., Server]) -> Server:
    return module_server_factory(HOST_ESTATE, ["--log-format", "json"])


@pytest.fixture(scope="module")
def finished(server: Server) -> Iterator[int]:
    """A task that ran to its end on pool `local`."""
    with server.api() as api:
        task = api.post("/tasks", json={"command": ["true"], "resource": "cpu"}).json()
    server.wait_state(task["id"], {"completed"}, timeout=90)
    yield int(task["id"])


def scrape(server: Server, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, by name and labels."""
    answer = httpx.get(server.url + "/metrics", headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_a_finished_task_moves_its_pools_counts(server: Server, finished: int) -> None:
    samples = scrape(server)
    assert value(samples, "klique_tasks", state="completed", pool="local") >= 1
    # The cycle histogram has samples, and every one fits under +Inf.
    cycles = value(samples, "klique_scheduler_cycle_seconds_count")
    assert cycles > 0
    assert value(samples, "klique_scheduler_cycle_seconds_bucket", le="+Inf") == cycles
    assert value(samples, "klique_pool_up", pool="local") == 1
    assert value(samples, "klique_pool_last_good_answer_timestamp_seconds", pool="local") > 0
    assert value(samples, "klique_pool_looks_total", pool="local") > 0
    assert value(samples, "klique_route_tunnels") == 0
    assert value(samples, "process_resident_memory_bytes") > 0
    # The task's own page was asked for by its route's template, not by its path.
    shown = value(
        samples,
        "klique_http_request_duration_seconds_count",
        method="GET",
        route="/api/v1/tasks/{task_id}",
        status="2xx",
    )
    assert shown >= 1


def test_a_new_task_counts_at_the_next_scrape(server: Server, finished: int) -> None:
    before = value(scrape(server), "klique_tasks", state="completed", pool="local")
    with server.api() as api:
        task = api.post("/tasks", json={"command": ["true"], "resource": "cpu"}).json()
    server.wait_state(task["id"], {"completed"}, timeout=90)
    after = value(scrape(server), "klique_tasks", state="completed", pool="local")
    assert after == before + 1


def test_label_names_are_bounded(server: Server, finished: int) -> None:
    for i in range(5):  # paths no route serves, each different
        httpx.get(f"{server.url}/api/v1/no-such-thing-{i}", timeout=30)
    samples = scrape(server)
    names = {name for _, labels in samples for name, _ in labels}
    assert names <= BOUNDED_LABELS, names - BOUNDED_LABELS
    routes = {dict(labels).get("route") for _, labels in samples} - {None}
    assert "unmatched" in routes
    assert not any("no-such-thing" in str(route) for route in routes)


def test_a_token_in_the_home_closes_metrics(server: Server) -> None:
    token_file = server.home / "metrics.token"
    token_file.write_text("scrape-me-please\n")
    try:
        refused = httpx.get(server.url + "/metrics", timeout=30)
        assert refused.status_code == 401
        assert "metrics.token" in refused.text
        wrong = httpx.get(
            server.url + "/metrics", headers={"Authorization": "Bearer nope"}, timeout=30
        )
        assert wrong.status_code == 401
        assert scrape(server, Authorization="Bearer scrape-me-please")
    finally:
        token_file.unlink()
    assert scrape(server)


def test_every_log_line_is_json_with_the_placement(server: Server, finished: int) -> None:
    def events() -> list[dict[str, Any]]:
        lines = (server.home / "server.log").read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    parsed = events()  # every line parses, or json.loads raises here
    for event in parsed:
        assert {"time", "level", "logger", "message"} <= set(event), event

    def placed() -> list[dict[str, Any]]:
        ids = {"task_id": finished, "pool": "local"}
        return [e for e in events() if ids.items() <= e.items() and "placed" in e["message"]]

    wait_for(placed, 10, f"the placement of task {finished} in the JSON log")


def test_the_alert_rules_and_the_docs_name_only_metrics_there_are(server: Server) -> None:
    answer = httpx.get(server.url + "/metrics", timeout=30)
    families = {f.name for f in text_string_to_metric_families(answer.text)}
    # prometheus-client's `_created` series say when a counter began: not a metric of ours.
    exported = {n for n in families if n.startswith("klique_") and not n.endswith("_created")}
    rules = (ROOT / "deploy" / "prometheus" / "klique-alerts.yml").read_text()
    used = {re.sub(r"_(bucket|count|sum|total)$", "", n) for n in re.findall(r"klique_\w+", rules)}
    assert used - {"klique"} <= exported, used - exported
    documented = (ROOT / "docs" / "operations.md").read_text()
    for name in exported:  # every metric has its row in the operator's table
        shown = f"{name}_total" if f"{name}_total`" in documented else name
        assert f"`{shown}`" in documented, name


def test_the_agents_log_is_json_too(tmp_path) -> None:
    token = tmp_path / "agent.token"
    token.write_text("not-a-real-token")
    argv = [sys.executable, "-m", "broker", "agent", "--log-format", "json", "--pool", "hpc"]
    argv += ["--server", f"http://127.0.0.1:{free_port()}", "--token-file", str(token)]
    env = {**os.environ, "KLIQUE_HOME": str(tmp_path / "home")}
    agent = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert agent.stderr is not None
        ready, _, _ = select.select([agent.stderr], [], [], 60)
        assert ready, "the agent logged nothing in 60 s"
        event = json.loads(agent.stderr.readline())
    finally:
        agent.kill()
        agent.wait()
    assert event["logger"] == "klique.agent" and event["level"] == "WARNING"
    assert "waiting for the control plane" in event["message"] and event["time"]
