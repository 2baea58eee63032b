"""Tasks on several nodes, on a real two-node Slurm cluster (tests/conftest_services.py
`multinode_slurm_cluster`: nodes n1 and n2 on this host, one slurmd each): one runner per
node, started by srun; the ranks find each other at MASTER_ADDR:MASTER_PORT; the task ends
with the worst of its ranks' endings."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import Server, start_server, stop_server, submitted_id, wait_for
from helpers.batch import (
    JOB_PYTHON,
    login_node,
    open_folder,
    pool_yaml,
    remove_tree,
    search_path,
    shared_folder,
    start_now,
)

pytestmark = pytest.mark.slurm

ESTATE = """
resources:
  one:
    profile: {cpus: 1, memory: 100M, walltime: 10m, pools: [batch]}
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


# Creates the file named by its second argument, then runs until the file named by its first
# exists.
STARTED_THEN_WAIT = """
import os, sys, time
open(sys.argv[2], "a").close()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
"""


@dataclass
class NodesPool:
    server: Server
    job_root: Path
    token: str
    env: dict[str, str]  # Slurm's commands, as root, on this cluster

    def submit(self, script: str, *args: str, resource: str = "pair") -> int:
        argv = ("submit", "--no-code", "--json", "-r", resource, "--", JOB_PYTHON, "-c", script)
        return submitted_id(self.server.cli(*argv, *args, token=self.token))

    def slurm(self, *argv: str) -> str:
        done = subprocess.run(argv, capture_output=True, text=True, check=True, env=self.env)
        return done.stdout


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
        root_env = {"PATH": "/usr/bin:/bin", "SLURM_CONF": env["SLURM_CONF"]}
        yield NodesPool(server, job_root, server.make_token("alice"), root_env)
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


def test_a_node_that_fails_sends_its_task_back_to_pending_and_it_runs_again(nodes_pool):
    """slurm.conf(5) JobRequeue (default 1) and the script's --requeue: the node under a running
    job goes DOWN, slurmctld requeues the job (NODE_FAIL in its records, the same job id, restart
    count 1). Klique shows the task pending with the requeue, then running again, then
    completed: one job, one task."""
    pool = nodes_pool
    marks = open_folder(pool.job_root / "marks-node-failure")
    go, started = marks / "go", marks / "started"
    task_id = pool.submit(STARTED_THEN_WAIT, str(go), str(started), resource="one")
    try:
        task = pool.server.wait_state(task_id, {"running"}, timeout=90, token=pool.token)
        job = str(task["native_id"])
        wait_for(started.exists, 90, "the task's command to start")
        node = pool.slurm("squeue", "--noheader", f"--jobs={job}", "--format=%N").strip()
        assert node in ("n1", "n2"), node

        def moves() -> list[tuple[str, str]]:
            task = pool.server.task(task_id, pool.token)
            return [(e["from"], e["to"]) for e in task["events"]]

        try:
            pool.slurm("scontrol", "update", f"nodename={node}", "state=down", "reason=failed")
            wait_for(lambda: ("running", "pending") in moves(), 120, "the task back to pending")
        finally:  # ReturnToService=2 returns it once its slurmd answers; a resume is quicker
            subprocess.run(
                ["scontrol", "update", f"nodename={node}", "state=resume"],
                capture_output=True,
                env=pool.env,
                check=False,
            )
        # Slurm holds a requeued job back (BeginTime); an operator's start-now ends that wait.
        start_now(pool.env, job)
        wait_for(lambda: moves()[-1] == ("pending", "running"), 180, "the run after the failure")
    finally:
        go.touch()
    ended = pool.server.wait_state(task_id, timeout=90, token=pool.token)
    assert ended["state"] == "completed", ended
    back = [e for e in ended["events"] if (e["from"], e["to"]) == ("running", "pending")]
    assert len(back) == 1 and back[0]["reason"].startswith("requeued by slurm (restart 1)"), back
    listed = pool.slurm("squeue", "--all", "--states=all", "--noheader", "--format=%i|%j|%T|%o")
    records = [line.strip().split("|", 3) for line in listed.splitlines()]
    tag, here = f"klique-{task_id}", f"{pool.job_root}/"
    ours = [
        (i, state) for i, name, state, script in records if name == tag and script.startswith(here)
    ]
    assert ours == [(job, "COMPLETED")], listed
