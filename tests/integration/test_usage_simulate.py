"""Metering and the dry run end to end: a host pool with GPUs, a real server, the CLI."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FINAL, HOST_ACCESS, TASK_PY, Server, wait_for

from broker.usage import Run, parse_since, summarise

PY = TASK_PY
LONG = [PY, "-c", "import time; time.sleep(600)"]

ESTATE = (
    """
teams:
  vision: [alice]
  nlp: [bob]
resources:
  1-gpu:
    profile: {cpus: 1, memory: 1G, walltime: 1h, gpus: 1, pools: [local]}
pools:
  local:
    kind: host
    slots: 4
    gpus: 2
    """
    + HOST_ACCESS
    + """
policies:
  vision: {resources: [1-gpu]}
  nlp: {resources: [1-gpu]}
"""
)


def submit(server: Server, token: str, command: list[str], project: str = "default") -> int:
    with server.api(token) as api:
        answer = api.post("/tasks", json={"command": command, "project": project})
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


def usage(server: Server, *args: str, token: str | None = None) -> dict[str, Any]:
    result = server.cli("usage", "--json", *args, token=token)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


TOKENS: dict[str, dict[str, str]] = {}


def tokens(server: Server) -> tuple[str, str]:
    return TOKENS[server.url]["alice"], TOKENS[server.url]["bob"]


def by_key(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["key"]: row for row in answer["rows"]}


@pytest.fixture
def gpu_server(server_factory: Callable[..., Server]) -> Iterator[Server]:
    server = server_factory(ESTATE)
    TOKENS[server.url] = {u: server.make_token(u) for u in ("alice", "bob")}
    yield server
    with server.api() as api:  # host runners outlive the server: stop what is still going
        for task in api.get("/tasks", params={"all_users": True}).json():
            if task["state"] not in FINAL:
                api.post(f"/tasks/{task['id']}/cancel")


def test_usage_sums_the_ledger_by_team_user_and_project(gpu_server: Server) -> None:
    alice, bob = tokens(gpu_server)
    short = [PY, "-c", "import time; time.sleep(0.3)"]
    done = {
        submit(gpu_server, alice, short, "detector"): alice,
        submit(gpu_server, bob, short, "parser"): bob,
    }
    tasks = {t: gpu_server.wait_state(t, token=token) for t, token in done.items()}
    assert all(t["state"] == "completed" for t in tasks.values()), tasks
    held = {t["owner"]: t["finished_at"] - t["started_at"] for t in tasks.values()}

    teams = by_key(usage(gpu_server, "--by", "team"))
    assert set(teams) == {"vision", "nlp"}
    for team, owner in (("vision", "alice"), ("nlp", "bob")):
        row = teams[team]
        assert (row["runs"], row["ongoing"]) == (1, 0)
        assert row["gpu_seconds"] == pytest.approx(held[owner], abs=1e-3)  # 1 GPU each
        assert row["wall_seconds"] == pytest.approx(held[owner], abs=1e-3)
        assert row["gpu_hours"] == pytest.approx(row["gpu_seconds"] / 3600)
        assert row["gpu_seconds"] > 0  # the profile holds a GPU, so time held counts
    assert set(by_key(usage(gpu_server, "--by", "user"))) == {"alice", "bob"}
    assert set(by_key(usage(gpu_server, "--by", "project"))) == {"detector", "parser"}

    mine = usage(gpu_server, "--by", "user", token=alice)
    assert mine["everyone"] is False and set(by_key(mine)) == {"alice"}

    long_id = submit(gpu_server, alice, LONG, "detector")
    gpu_server.wait_state(long_id, {"running"}, token=alice)
    first = by_key(usage(gpu_server, "--by", "project", token=alice))["detector"]
    assert (first["runs"], first["ongoing"]) == (2, 1)
    wait_for(
        lambda: (
            by_key(usage(gpu_server, "--by", "project", token=alice))["detector"]["gpu_seconds"]
            > first["gpu_seconds"] + 0.2
        ),
        30,
        "the ongoing run's GPU-seconds to grow",
    )
    assert usage(gpu_server, "--since", "2099-01-01")["rows"] == []
    assert set(by_key(usage(gpu_server, "--since", "1h"))) == {"vision", "nlp"}

    table = gpu_server.cli("usage", "--by", "team").output.splitlines()
    assert table[0].startswith("usage by team, all time until ") and "(everyone)" in table[0]
    assert table[1].split() == [
        "TEAM",
        "RUNS",
        "ONGOING",
        "GPU-SECONDS",
        "GPU-HOURS",
        "WALL-SECONDS",
    ]
    assert {line.split()[0] for line in table[2:]} == {"vision", "nlp"}
    bad = gpu_server.cli("usage", "--since", "last tuesday")
    assert bad.exit_code == 2 and "neither a time ago nor a date" in bad.output


def estate_file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_simulate_says_what_a_changed_estate_would_start(
    gpu_server: Server, tmp_path: Path
) -> None:
    alice, bob = tokens(gpu_server)
    for _ in range(2):
        gpu_server.wait_state(submit(gpu_server, alice, LONG), {"running"}, token=alice)
    waiting = [submit(gpu_server, alice, ["true"]), submit(gpu_server, bob, ["true"])]
    wait_for(
        lambda: all(
            json.loads(gpu_server.cli("why", str(t), "--json").output)["waiting"] for t in waiting
        ),
        30,
        "the last two tasks to wait for a GPU",
    )

    more_gpus = estate_file(tmp_path, "four.yaml", ESTATE.replace("gpus: 2", "gpus: 4"))
    result = gpu_server.cli("policy", "simulate", "--estate", more_gpus, "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert (answer["queued"], answer["active"]) == (2, 2)
    assert [(t["id"], t["outcome"], t["pool"]) for t in answer["tasks"]] == [
        (waiting[0], "start", "local"),
        (waiting[1], "start", "local"),
    ]
    assert {t["team"]: (t["start"], t["wait"]) for t in answer["teams"]} == {
        "vision": (1, 0),
        "nlp": (1, 0),
    }
    text = gpu_server.cli("policy", "simulate", "--estate", more_gpus).output
    assert f"task {waiting[0]} (alice, vision, 1-gpu): would start on local" in text
    assert "by team:" in text and "local: 1" in text

    no_nlp = estate_file(
        tmp_path, "no-nlp.yaml", ESTATE.replace("  nlp: {resources: [1-gpu]}\n", "")
    )
    trace = tmp_path / "trace.json"
    result = gpu_server.cli("policy", "simulate", "--estate", no_nlp, "--save-trace", str(trace))
    assert result.exit_code == 0, result.output
    assert f"task {waiting[1]} (bob, nlp, 1-gpu): would wait: the team's policy" in result.output
    assert f"task {waiting[0]} (alice, vision, 1-gpu): would wait: no pool" in result.output
    assert "local: needs 1 GPU, 0 free" in result.output
    online = json.loads(gpu_server.cli("policy", "simulate", "--estate", no_nlp, "--json").output)

    # The recorded trace replays here with no server, to the same verdicts.
    offline = Server("http://127.0.0.1:9", gpu_server.home, "none", gpu_server.process)
    replay = offline.cli("policy", "simulate", "--estate", no_nlp, "--trace", str(trace), "--json")
    assert replay.exit_code == 0, replay.output
    assert json.loads(replay.output)["tasks"] == online["tasks"]

    # Nothing changed on the server.
    assert [gpu_server.task(t)["state"] for t in waiting] == ["queued", "queued"]


def test_simulate_refuses_a_bad_estate_and_non_admins(gpu_server: Server, tmp_path: Path) -> None:
    broken = estate_file(tmp_path, "broken.yaml", ESTATE.replace("slots: 4", "slots: four"))
    line = ESTATE.splitlines().index("    slots: 4") + 1
    result = gpu_server.cli("policy", "simulate", "--estate", broken)
    assert result.exit_code == 2
    assert f"{broken}:{line}: pools.local.slots: Input should be a valid integer" in result.output
    missing = gpu_server.cli("policy", "simulate", "--estate", str(tmp_path / "nope.yaml"))
    assert missing.exit_code == 1 and "cannot read the estate file" in missing.output
    fine = estate_file(tmp_path, "fine.yaml", ESTATE)
    alice, _bob = tokens(gpu_server)
    refused = gpu_server.cli("policy", "simulate", "--estate", fine, token=alice)
    assert refused.exit_code == 1 and "only an admin token can simulate" in refused.output
    bad_trace = estate_file(tmp_path, "trace.json", '[{"id": 1}]')
    replay = gpu_server.cli("policy", "simulate", "--estate", fine, "--trace", bad_trace)
    assert replay.exit_code == 1 and f"{bad_trace}: not a trace" in replay.output
    assert "queued.0.owner: Field required" in replay.output


def test_summarise_clips_runs_to_the_window_and_counts_ongoing_runs_to_now() -> None:
    runs = [
        Run("alice", "vision", "p", "1-gpu", "local", 2.0, 0.0, 100.0),
        Run("alice", "vision", "p", "1-gpu", "local", 1.0, 150.0, None),
        Run("bob", None, "q", "cpu", "local", 0.0, 10.0, 20.0),
        Run("bob", None, "q", "cpu", "local", 0.0, 0.0, 40.0),
    ]
    vision, nobody = summarise(runs, "team", until=200.0, since=15.0)
    assert (vision.key, vision.runs, vision.ongoing) == ("vision", 2, 1)
    assert vision.gpu_seconds == pytest.approx(2.0 * 85 + 1.0 * 50)
    assert vision.wall_seconds == pytest.approx(85 + 50)
    assert (nobody.key, nobody.runs, nobody.ongoing) == ("(no team)", 2, 0)
    assert (nobody.gpu_seconds, nobody.wall_seconds) == (0.0, pytest.approx(5 + 25))
    (late,) = summarise(runs, "project", until=200.0, since=120.0)
    assert (late.key, late.runs, late.gpu_seconds) == ("p", 1, pytest.approx(50.0))
    users = {u.key: u for u in summarise(runs, "user", until=200.0)}
    assert users["bob"].runs == 2 and users["bob"].gpu_seconds == 0.0
    assert users["alice"].gpu_seconds == pytest.approx(200.0 + 50.0)


def test_since_reads_ages_dates_and_unix_seconds() -> None:
    now = time.time()
    assert parse_since("7d", now) == pytest.approx(now - 7 * 86400)
    assert parse_since("90m", now) == pytest.approx(now - 5400)
    assert parse_since("1700000000", now) == 1700000000.0
    assert parse_since("2026-11-01", now) == pytest.approx(
        time.mktime((2026, 11, 1, 0, 0, 0, 0, 0, -1))
    )
    with pytest.raises(ValueError, match="fix: write it like 7d"):
        parse_since("soon", now)
