"""What only the Slurm pool shows, on the real cluster from scripts/slurm-up; the scenarios every
batch pool shares are in test_batch_pools.py."""

import subprocess

import pytest
from batch_helpers import open_folder, pool_yaml, remove_tree, shared_folder
from conftest import start_server, stop_server, submitted_id, wait_for

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def held_pool(slurm_cluster, test_users):
    """A server whose compute resource `held` submits with --hold: the job never starts."""
    folder = shared_folder("klique-slurm-pool-")
    job_root = open_folder(slurm_cluster.work / f"jobs-{folder.name}")
    estate = folder / "estate.yaml"
    estate.write_text(
        """
resources:
  held:
    profile: {cpus: 1, memory: 100M, walltime: 10m, pools: [batch]}
    extra_directives: [--hold]
pools:
"""
        + pool_yaml("slurm", job_root, None)
    )
    server = start_server(folder / "home", estate)
    yield server, server.make_token("alice")
    stop_server(server)
    remove_tree(job_root)
    remove_tree(folder)


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
