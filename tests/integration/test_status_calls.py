"""One status query per pool per poll, whatever the number of tasks: 500 held tasks in one pool of
each scheduler, with the status command behind a wrapper on PATH that logs every call."""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import HTTP_TLS, Server, start_server, stop_server, wait_for
from helpers.batch import (
    batch_pool,
    count_lines,
    login_node,
    open_folder,
    remove_tree,
    run_as,
    search_path,
    shared_folder,
)
from helpers.estates import estate_yaml, profile

pytestmark = pytest.mark.long

TASKS = 500
POLL_INTERVAL_S = 1.0
LOOKS = 12  # the pool agent's looks measured once every task is in the pool
# Keeps the jobs queued: nothing runs, so the count is all the test measures (and a shared
# Slurm cluster is not filled with sleeping jobs).
HOLD = {"slurm": "--hold", "pbspro": "-h", "torque": "-h", "lsf": "-H"}
CANCEL = {"slurm": "scancel", "pbspro": "qdel", "torque": "qdel", "lsf": "bkill"}


def estate(scheduler: str, job_root: Path) -> str:
    pool = batch_pool(
        scheduler,
        job_root,
        None,
        max_queued=TASKS + 10,
        poll_interval=f"{POLL_INTERVAL_S:g}s",
        submit_concurrency=16,
    )
    held = profile("batch", cpus=1, memory="100M", walltime="1h")
    return estate_yaml(
        resources={"held": {**held, "extra_directives": [HOLD[scheduler]]}},
        pools={"batch": pool},
    )


def tasks_in(server: Server, token: str, state: str) -> list[dict[str, Any]]:
    """The tasks in `state` ("": any) of the token's user; every user's with the admin token."""
    params = {"state": state or None, "limit": TASKS * 2, "all_users": token == server.token}
    with server.api(token) as api:
        found = api.get("/tasks", params={k: v for k, v in params.items() if v is not None})
    return found.json()


def looks(server: Server) -> int:
    """How many times the pool's agent has looked at its pool."""
    health = httpx.get(server.url + "/api/v1/health", timeout=10, verify=HTTP_TLS)
    return int(health.json()["looks"]["batch"])


def covers_the_pool(scheduler: str, call: str, native_ids: set[str]) -> bool:
    """One call asks for every job of the pool: by account (Slurm) or by id (PBS, LSF)."""
    words = shlex.split(call)
    if scheduler == "slurm":
        return "--users=alice" in words
    return native_ids <= set(words)


@pytest.mark.parametrize(
    "scheduler",
    [pytest.param("slurm", marks=pytest.mark.slurm), "pbspro", "torque", "lsf"],
)
def test_one_status_call_per_poll_with_500_active_tasks(
    scheduler: str, request: Any, test_users: Any
) -> None:
    folder = shared_folder(f"klique-calls-{scheduler}-")
    calls_file = folder / "status-calls"
    if scheduler == "slurm":
        cluster = request.getfixturevalue("slurm_cluster")
        job_root = open_folder(cluster.work / f"jobs-{folder.name}")
        sim_dir = None
    else:
        job_root = open_folder(folder / "jobs")
        sim_dir = open_folder(folder / "sim")
    path = search_path(login_node(folder, scheduler, sim_dir, calls_file))
    (folder / "estate.yaml").write_text(estate(scheduler, job_root))
    server = start_server(folder / "home", folder / "estate.yaml", {"PATH": path})
    try:
        token = server.make_token("alice")
        with server.api(token) as api:
            for _ in range(TASKS):
                done = api.post("/tasks", json={"command": ["sleep", "600"], "resource": "held"})
                assert done.status_code < 300, done.text

        def all_pending() -> bool:
            return len(tasks_in(server, token, "pending")) == TASKS

        wait_for(all_pending, 600, f"{TASKS} tasks to be pending in {scheduler}", interval=1.0)
        native_ids = {t["native_id"] for t in tasks_in(server, token, "pending")}

        # Read in this order, every call counted falls in a look that ends after the first
        # read of the look counter, and within the measured time.
        looks_before = looks(server)
        start = time.monotonic()
        before = len(count_lines(calls_file))
        wait_for(lambda: looks(server) >= looks_before + LOOKS, 120, f"{LOOKS} looks")
        calls = count_lines(calls_file)[before:]
        elapsed = time.monotonic() - start
        looks_seen = looks(server) - looks_before

        # At most one call per look at the pool (the one under way at the end counts once more)
        # and at most one per poll interval (its jitter never goes below 0.9 of it).
        assert 2 <= len(calls) <= looks_seen + 1, (len(calls), looks_seen)
        assert len(calls) <= elapsed / (0.9 * POLL_INTERVAL_S) + 1, (len(calls), elapsed)
        assert all(covers_the_pool(scheduler, call, native_ids) for call in calls), calls[-1]
        assert len(tasks_in(server, token, "pending")) == TASKS
    finally:
        submitted = {t["native_id"] for t in tasks_in(server, server.token, "") if t["native_id"]}
        stop_server(server)
        ids = sorted(submitted)
        for chunk in range(0, len(ids), 100):
            run_as("alice", [CANCEL[scheduler], *ids[chunk : chunk + 100]], path)
        remove_tree(job_root)
        remove_tree(folder)
