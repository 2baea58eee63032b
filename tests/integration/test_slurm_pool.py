"""What only the Slurm pool shows, on the real cluster from scripts/slurm-up; the scenarios every
batch pool shares are in test_batch_pools.py."""

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from conftest import Server, start_server, stop_server, submitted_id, wait_for
from helpers.batch import open_folder, pool_yaml, remove_tree, shared_folder

pytestmark = pytest.mark.slurm


@contextmanager
def slurm_server(cluster: Any, resource: str, **pool: Any) -> Iterator[tuple[Server, str]]:
    """A server with one compute resource (`resource`: its YAML) on a Slurm pool `batch` with
    these settings, and a token for alice."""
    folder = shared_folder("klique-slurm-pool-")
    job_root = open_folder(cluster.work / f"jobs-{folder.name}")
    estate = folder / "estate.yaml"
    estate.write_text(
        f"resources:\n{resource}pools:\n" + pool_yaml("slurm", job_root, None, **pool)
    )
    server = start_server(folder / "home", estate)
    try:
        yield server, server.make_token("alice")
    finally:
        stop_server(server)
        remove_tree(job_root)
        remove_tree(folder)


@pytest.fixture(scope="module")
def held_pool(slurm_cluster, test_users):
    """A server whose compute resource `held` submits with --hold: the job never starts."""
    held = """  held:
    profile: {cpus: 1, memory: 100M, walltime: 10m, pools: [batch]}
    extra_directives: [--hold]
"""
    with slurm_server(slurm_cluster, held) as served:
        yield served


def test_a_held_job_is_pending_with_squeues_reason(held_pool):
    server, token = held_pool
    task_id = submitted_id(
        server.cli("submit", "--no-code", "--json", "-r", "held", "--", "true", token=token)
    )
    try:
        task = server.wait_state(task_id, {"pending"}, token=token)
        assert task["reason"] == "pending in Slurm's queue; JobHeldUser", task
    finally:
        server.cli("cancel", str(task_id), token=token)
    native_id = server.task(task_id, token)["native_id"]

    def gone():
        out = subprocess.run(
            ["squeue", "--noheader", "--states=all", f"--jobs={native_id}", "--format=%T"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        return out in ("", "CANCELLED")

    wait_for(gone, 60, f"job {native_id} to leave the queue")


def test_a_claimed_end_is_confirmed_without_waiting_for_the_next_poll(slurm_cluster, test_users):
    """The runner reports its end just before its job ends: the pool looks again soon after,
    rather than at its poll interval (an hour here), and the tasks end with their exit codes."""
    short = "  short: {profile: {cpus: 1, memory: 100M, walltime: 10m, pools: [batch]}}\n"
    with slurm_server(slurm_cluster, short, poll_interval="1h") as (server, alice):
        submit = ("submit", "--no-code", "--json", "-r", "short", "--", "sh", "-c")
        ids = {
            code: submitted_id(server.cli(*submit, f"exit {code}", token=alice)) for code in (0, 3)
        }
        for code, task_id in ids.items():
            task = server.wait_state(task_id, token=alice, timeout=120)
            expected = ("completed", 0) if code == 0 else ("failed", code)
            assert (task["state"], task["exit_code"]) == expected, task
