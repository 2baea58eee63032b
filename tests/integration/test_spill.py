"""Spill-over end to end: the real Slurm pool first in the profile's order, and full."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FINAL, HOST_ACCESS, Server, start_server, stop_server, wait_for

pytestmark = pytest.mark.slurm

JOB_PYTHON = "/usr/bin/python3"  # the test accounts cannot read the virtual environment's
TASKS = 6
MAX_QUEUED = 2
IN_SLURM = {"placed", "submitted", "pending", "running"}


def spill_estate(job_root: Path) -> str:
    return f"""
resources:
  1-gpu:
    profile: {{gpus: 1, cpus: 1, memory: 100M, walltime: 10m, pools: [slurm, local]}}
pools:
  slurm:
    kind: slurm
    partition: gpu
    job_root: {job_root}
    python: {JOB_PYTHON}
    poll_interval: 1s
    lost_after: 30s
    accounting: jobcomp
    max_queued: {MAX_QUEUED}
    max_wait: 5s
    user_map: {{alice: alice}}
  local:
    kind: host
    slots: 2
    gpus: 2
    {HOST_ACCESS.replace("$JOB_ROOT", str(job_root))}
"""


def squeue(*args: str) -> list[list[str]]:
    done = subprocess.run(
        ["squeue", "--noheader", *args], capture_output=True, text=True, check=True, timeout=60
    )
    return [line.split("|") for line in done.stdout.splitlines() if line.strip()]


@pytest.fixture
def full_gpu_partition(slurm_cluster: Any) -> Iterator[list[str]]:
    """Every fake GPU held by a long job of bob's, submitted outside Klique; cancelled after."""
    fillers: list[str] = []
    try:
        for _ in range(4):
            done = subprocess.run(
                [
                    "runuser",
                    "-u",
                    "bob",
                    "--",
                    "sbatch",
                    "--parsable",
                    "--partition=gpu",
                    "--gres=gpu:1",
                    "--time=5",  # bounded even if the clean-up below never runs
                    "--job-name=spill-filler",
                    "--output=/dev/null",
                    "--wrap",
                    "sleep 300",
                ],
                capture_output=True,
                text=True,
                cwd=slurm_cluster.work,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            fillers.append(done.stdout.strip().split(";")[0])

        def all_running() -> bool:
            states = squeue("--states=all", f"--jobs={','.join(fillers)}", "--format=%i|%T")
            return len(states) == 4 and all(state == "RUNNING" for _, state in states)

        wait_for(all_running, 180, "bob's four GPU jobs to run", interval=0.5)
        yield fillers
    finally:
        if fillers:
            subprocess.run(["scancel", *fillers], check=False, timeout=60)


@pytest.fixture
def spill_server(tmp_path: Path, slurm_cluster: Any) -> Iterator[tuple[Server, Path]]:
    job_root = slurm_cluster.work / f"spill-{os.getpid()}-{tmp_path.name}"
    job_root.mkdir(mode=0o1777)
    os.chmod(job_root, 0o1777)
    estate = tmp_path / "estate.yaml"
    estate.write_text(spill_estate(job_root))
    server = start_server(tmp_path / "home", estate)
    try:
        yield server, job_root
    finally:
        stop_server(server)
        ours = [row[0] for row in slurm_jobs(job_root) if row[2] in ("PENDING", "RUNNING")]
        if ours:
            subprocess.run(["scancel", *ours], check=False, timeout=60)
        shutil.rmtree(job_root, ignore_errors=True)


def slurm_jobs(job_root: Path) -> list[list[str]]:
    """Every job whose script lies under this test's job root: [id, name, state, script]."""
    rows = squeue("--states=all", "--users=alice", "--format=%i|%j|%T|%o")
    return [row for row in rows if len(row) == 4 and row[3].startswith(f"{job_root}/")]


def test_tasks_spill_from_a_full_slurm_pool_to_the_host_pool(
    full_gpu_partition: list[str], spill_server: tuple[Server, Path]
) -> None:
    server, job_root = spill_server
    with server.api(server.make_token("alice")) as api:
        ids = [
            api.post(
                "/tasks",
                json={"command": [JOB_PYTHON, "-c", "print('ran')"], "resource": "1-gpu"},
            ).json()["id"]
            for _ in range(TASKS)
        ]
        most_in_slurm = 0

        def all_final() -> bool:
            nonlocal most_in_slurm
            tasks = [t for t in api.get("/tasks").json() if t["id"] in ids]
            in_slurm = sum(1 for t in tasks if t["pool"] == "slurm" and t["state"] in IN_SLURM)
            most_in_slurm = max(most_in_slurm, in_slurm)
            return all(t["state"] in FINAL for t in tasks)

        try:
            wait_for(all_final, 180, f"all {TASKS} tasks to end", interval=0.2)
        finally:
            queue = slurm_jobs(job_root)
        shown = {i: api.get(f"/tasks/{i}").json() for i in ids}

    outcomes = [(t["state"], t["pool"]) for t in shown.values()]
    assert outcomes == [("completed", "local")] * TASKS, [
        (t["id"], t["state"], t["pool"], t["reason"]) for t in shown.values()
    ]
    assert most_in_slurm <= MAX_QUEUED

    spilled = {
        i: t
        for i, t in shown.items()
        if any("waited past max_wait in slurm" in e["reason"] for e in t["events"])
    }
    assert spilled, json.dumps(shown, indent=2)
    for task in spilled.values():
        states = [e["to"] for e in task["events"]]
        back = states.index("queued", 1)
        assert states[back - 1] in ("submitted", "pending"), states
        assert states[back:] == ["queued", "placed", "submitted", "running", "completed"], states

    # Slurm got jobs for the spilled tasks, and cancelled every one: none ran.
    names = {row[1] for row in queue}
    assert {f"klique-{i}" for i in spilled} <= names, queue
    assert {row[2] for row in queue} <= {"CANCELLED"}, queue
    running = squeue("--states=all", f"--jobs={','.join(full_gpu_partition)}", "--format=%T")
    assert running == [["RUNNING"]] * 4, "bob's GPU jobs ended early: Slurm was not kept full"
