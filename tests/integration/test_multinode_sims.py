"""Tasks on several nodes on the PBS Professional, Torque and LSF simulators with two execution
hosts (KLIQUE_SIM_NODES=2): the runners are started by pbsdsh and blaunch, one per host, and
learn their rank from them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import Server, start_server, stop_server, submitted_id
from helpers.batch import (
    JOB_PYTHON,
    login_node,
    open_folder,
    pool_yaml,
    remove_tree,
    search_path,
    shared_folder,
)
from test_multinode import ESTATE  # one compute resource `pair` of two nodes

# Where each rank ran, as the scheduler's launcher said; rank 1 fails when told to.
SAYS_WHERE = """
import os, sys
where = os.environ.get("PBS_NODENUM") or os.environ.get("LSF_PM_TASKID")
print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} nodes {os.environ['KLIQUE_NODES']}"
      f" master {os.environ['MASTER_ADDR']} launcher {where}", flush=True)
sys.exit(3 if sys.argv[1:] == ["fail"] and os.environ["RANK"] == "1" else 0)
"""

LAUNCHER = {"pbspro": ("0", "1"), "torque": ("0", "1"), "lsf": ("1", "2")}


@pytest.fixture(scope="module", params=["pbspro", "torque", "lsf"])
def sim_pool(request, test_users) -> Iterator[tuple[str, Server, str]]:
    scheduler = request.param
    folder = shared_folder(f"klique-{scheduler}-nodes-")
    job_root = open_folder(folder / "jobs")
    sim = open_folder(folder / "sim")
    settings = {"KLIQUE_SIM_NODES": "2", "KLIQUE_SIM_HOST": "sim"}
    path = search_path(login_node(folder, scheduler, sim, settings=settings))
    estate = folder / "estate.yaml"
    estate.write_text(ESTATE + pool_yaml(scheduler, job_root, None))
    server = start_server(folder / "home", estate, {"PATH": path})
    try:
        yield scheduler, server, server.make_token("alice")
    finally:
        stop_server(server)
        remove_tree(folder)


def run(server: Server, token: str, *args: str) -> dict:
    cli = ("submit", "--no-code", "--json", "-r", "pair", "--", JOB_PYTHON, "-c", SAYS_WHERE)
    task_id = submitted_id(server.cli(*cli, *args, token=token))
    return server.wait_state(task_id, {"completed", "failed"}, timeout=60, token=token)


def test_one_runner_a_host_each_told_its_rank(sim_pool):
    scheduler, server, token = sim_pool
    task = run(server, token)
    assert task["state"] == "completed", task
    first, second = LAUNCHER[scheduler]
    rank0 = server.cli("logs", str(task["id"]), token=token).output
    rank1 = server.cli("logs", str(task["id"]), "--rank", "1", token=token).output
    where = "nodes sim-1,sim-2 master sim-1 launcher"
    assert f"rank 0 of 2 {where} {first}" in rank0, rank0
    assert f"rank 1 of 2 {where} {second}" in rank1, rank1


def test_a_failing_rank_fails_the_task_with_its_reason(sim_pool):
    _, server, token = sim_pool
    task = run(server, token, "fail")
    assert task["state"] == "failed", task
    assert task["reason"].startswith("rank 1: exited with code 3"), task
