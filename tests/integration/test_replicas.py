"""Two servers on one PostgreSQL store (scripts/pg-up): one leads (the scheduler's lease,
broker/control/lease.py), both serve the API; a task created on the follower runs; SIGKILL of
the leader, and the other leads within the lease's time and runs what is created on it. SQLite
serves one server: a second is refused in one sentence."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import HOST_ACCESS, ROOT, TASK_PY, Server, shared_folder, start_server, wait_for
from helpers.postgres import fresh_schema

pytestmark = pytest.mark.postgres

TTL = 4.0  # the lease's time in these tests (the default is 8 s)


def ready(server: Server) -> dict:
    return httpx.get(server.url + "/readyz", timeout=10).json()


@pytest.fixture(scope="module")
def replicas(postgres_url, tmp_path_factory):
    """Replicas "a" then "b" of one estate (a host pool) on one store; "a" leads."""
    folder = tmp_path_factory.mktemp("replicas")
    job_root = shared_folder("klique-jobs-")
    access = HOST_ACCESS.replace("$JOB_ROOT", str(job_root))
    estate = folder / "estate.yaml"
    estate.write_text(
        "resources:\n  cpu:\n    profile: {cpus: 1, memory: 200M, walltime: 10m, pools: [p]}\n"
        f"pools:\n  p:\n    kind: host\n    slots: 4\n    {access}\n"
    )
    env = {"KLIQUE_DB": fresh_schema(postgres_url, "replicas")}
    started: dict[str, Server] = {}

    def start(name: str) -> Server:
        args = ["--replica-id", name, "--lease-ttl", str(TTL)]
        if started:  # the store's admin token, made by the first: start_server signs in with it
            (folder / name).mkdir()
            shutil.copy(started["a"].home / "admin.token", folder / name / "admin.token")
        started[name] = start_server(folder / name, estate, env, args)
        return started[name]

    start("a")
    wait_for(lambda: ready(started["a"])["role"] == "leader", 30, "replica a to lead")
    start("b")
    yield started
    for server in started.values():
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
    shutil.rmtree(job_root, ignore_errors=True)


def create(server: Server, token: str, words: str) -> int:
    body = {"command": [TASK_PY, "-c", f"print({words!r})"], "resource": "cpu"}
    with server.api(token) as api:
        answer = api.post("/tasks", json=body)
        assert answer.status_code in (200, 201), answer.text
        return int(answer.json()["id"])


def test_one_replica_leads_and_a_task_created_on_the_follower_runs(replicas) -> None:
    a, b = replicas["a"], replicas["b"]
    seen = ready(b)
    assert seen["ready"] is True and seen["store"] == "reachable"
    assert (seen["replica"], seen["role"], seen["holder"]) == ("b", "follower", "a")
    assert ready(a)["role"] == "leader" and ready(a)["term"] == seen["term"]
    # The admin token is the store's: either replica knows it.
    task_id = create(b, a.token, "made on the follower")
    assert b.wait_state(task_id, timeout=60, token=a.token)["state"] == "completed"


def test_the_follower_leads_within_the_lease_after_the_leader_is_killed(replicas) -> None:
    a, b = replicas["a"], replicas["b"]
    term = ready(b)["term"]
    a.process.kill()  # SIGKILL: no release, the lease ends on its own
    killed = time.monotonic()
    a.process.wait()
    wait_for(lambda: ready(b)["role"] == "leader", 3 * TTL, "replica b to lead")
    took = time.monotonic() - killed
    assert took <= TTL + 2.0, f"b led {took:.1f} s after the kill"
    now = ready(b)
    assert now["holder"] == "b" and now["term"] > term
    task_id = create(b, a.token, "made after the failover")
    assert b.wait_state(task_id, timeout=60, token=a.token)["state"] == "completed"


def test_a_second_server_on_one_sqlite_file_is_refused_in_one_sentence(tmp_path: Path) -> None:
    first = start_server(tmp_path / "one", None)
    try:
        env = {**os.environ, "KLIQUE_HOME": str(tmp_path / "one")}
        second = subprocess.run(
            [sys.executable, "-m", "broker", "server", "--port", "0", "--routes-port", "0"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        first.process.terminate()
        first.process.wait(20)
    assert second.returncode == 1
    assert "another klique server serves the SQLite store" in second.stderr
    assert "PostgreSQL" in second.stderr
