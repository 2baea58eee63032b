"""Tasks on several nodes, on a real two-node Slurm cluster (tests/conftest_services.py
`multinode_slurm_cluster`: nodes n1 and n2 on this host, one slurmd each): one runner per
node, started by srun; the ranks find each other at MASTER_ADDR:MASTER_PORT; the task ends
with the worst of its ranks' endings."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from batch_helpers import (
    JOB_PYTHON,
    login_node,
    open_folder,
    pool_yaml,
    remove_tree,
    search_path,
    shared_folder,
)
from conftest import Server, start_server, stop_server, submitted_id

pytestmark = pytest.mark.slurm

ESTATE = """
resources:
  pair:
    profile: {cpus: 1, memory: 100M, walltime: 10m, nodes: 2, pools: [batch]}
pools:
"""

# Each rank says where it is; rank 0 listens at MASTER_PORT, rank 1 connects to
# MASTER_ADDR:MASTER_PORT, and they trade ranks (rank 1 retries while rank 0 is not listening).
RENDEZVOUS = """
import os, socket, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
print(f"rank {rank} of {world} on {os.environ['SLURMD_NODENAME']} "
      f"local {os.environ['LOCAL_RANK']} nodes {os.environ['KLIQUE_NODES']}", flush=True)
if rank == 0:
    server = socket.create_server(("", port))
    server.settimeout(120)
    conn, _ = server.accept()
else:
    deadline = time.monotonic() + 120
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
conn.sendall(str(rank).encode())
print(f"rank {rank} met rank {conn.recv(16).decode()}", flush=True)
"""

# Rank 1 fails; rank 0 would run on, and is stopped by srun --kill-on-bad-exit.
RANK_ONE_FAILS = """
import os, sys, time
if os.environ["RANK"] == "1":
    print("rank 1 gives up", flush=True)
    sys.exit(3)
while True:
    time.sleep(1)
"""


@dataclass
class NodesPool:
    server: Server
    job_root: Path
    token: str

    def submit(self, script: str) -> int:
        args = ("submit", "--no-code", "--json", "-r", "pair", "--", JOB_PYTHON, "-c", script)
        return submitted_id(self.server.cli(*args, token=self.token))


@pytest.fixture(scope="module")
def nodes_pool(multinode_slurm_cluster) -> Iterator[NodesPool]:
    folder = shared_folder("klique-slurm-nodes-")
    job_root = open_folder(multinode_slurm_cluster.work / f"jobs-{folder.name}")
    estate = folder / "estate.yaml"
    estate.write_text(ESTATE + pool_yaml("slurm", job_root, None))
    path = search_path(login_node(folder, "slurm", None))
    env = {"PATH": path, "SLURM_CONF": str(multinode_slurm_cluster.conf)}
    server = start_server(folder / "home", estate, env)
    try:
        yield NodesPool(server, job_root, server.make_token("alice"))
    finally:
        stop_server(server)
        remove_tree(job_root)
        remove_tree(folder)


def test_two_ranks_meet_at_the_master_address_and_the_task_completes(nodes_pool):
    pool = nodes_pool
    task_id = pool.submit(RENDEZVOUS)
    task = pool.server.wait_state(task_id, {"completed", "failed"}, timeout=120, token=pool.token)
    assert task["state"] == "completed", task
    rank0 = pool.server.cli("logs", str(task_id), token=pool.token).output
    rank1 = pool.server.cli("logs", str(task_id), "--rank", "1", token=pool.token).output
    assert "rank 0 of 2 on n1 local 0 nodes n1,n2" in rank0, rank0
    assert "rank 0 met rank 1" in rank0, rank0
    assert "rank 1 of 2 on n2 local 0 nodes n1,n2" in rank1, rank1
    assert "rank 1 met rank 0" in rank1, rank1
    assert "rank 1" not in rank0.replace("met rank 1", ""), rank0
    exit_doc = json.loads((Path(task["job_dir"]) / "exit.json").read_text())
    assert [r["outcome"] for r in exit_doc["ranks"]] == ["completed", "completed"], exit_doc
    asked = pool.server.cli("logs", str(task_id), "--rank", "2", token=pool.token)
    assert asked.exit_code != 0 and "ranks 0 to 1" in asked.output, asked.output


def test_a_rank_that_fails_ends_the_task_with_its_reason(nodes_pool):
    pool = nodes_pool
    task_id = pool.submit(RANK_ONE_FAILS)
    task = pool.server.wait_state(task_id, {"completed", "failed"}, timeout=120, token=pool.token)
    assert task["state"] == "failed", task
    assert task["reason"].startswith("rank 1: exited with code 3"), task
    assert task["exit_code"] == 3, task
    rank1 = pool.server.cli("logs", str(task_id), "--rank", "1", token=pool.token).output
    assert "rank 1 gives up" in rank1, rank1
