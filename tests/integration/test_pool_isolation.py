"""One slow pool never delays another: a cluster whose commands hang beside a healthy Slurm
pool and a host pool. The healthy pools run their tasks while it hangs; it shows unreachable
with its reason; once it answers again its tasks end right, with one job each."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import start_server, stop_server, wait_for
from helpers.isolation import estate_with_a_hung_pool

pytestmark = [pytest.mark.slurm, pytest.mark.ssh]


def jobs_named(tag: str, job_root: Path) -> list[str]:
    """Slurm's jobs named `tag` whose script lies under `job_root`: this server's (task ids
    start at 1 in every test's server, and the shared cluster remembers ended jobs a while)."""
    done = subprocess.run(
        ["squeue", "--all", "--states=all", "--noheader", f"--name={tag}", "--format=%i|%o"],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [line.strip().split("|", 1) for line in done.stdout.splitlines()]
    return [job for job, script in lines if script.startswith(f"{job_root}/")]


def test_a_hung_pool_delays_no_other_pool(slurm_cluster: Any, sshd: Any, tmp_path: Any) -> None:
    with estate_with_a_hung_pool(slurm_cluster, sshd, hung=True) as estate:
        (tmp_path / "estate.yaml").write_text(estate.text)
        estate.hang.touch()  # the hung pool's commands stop answering from the start
        server = start_server(tmp_path / "home", tmp_path / "estate.yaml")
        try:
            alice = server.make_token("alice")

            def submit(resource: str) -> int:
                with server.api(alice) as api:
                    answer = api.post("/tasks", json={"command": ["true"], "resource": resource})
                assert answer.status_code == 201, answer.text
                return int(answer.json()["id"])

            stuck = [submit("stuck") for _ in range(3)]
            healthy = [submit("fast") for _ in range(3)] + [submit("local") for _ in range(3)]
            for task_id in healthy:  # while the other pool hangs
                assert server.wait_state(task_id, token=alice)["state"] == "completed"
            assert estate.hang.exists()

            def hung_pool() -> dict[str, Any] | None:
                pools = {p["name"]: p for p in json.loads(server.cli("pools", "--json").output)}
                pool = pools["slurm-hung"]
                hung = "did not finish within" in pool["reason"] or "no answer" in pool["reason"]
                return pool if not pool["reachable"] and hung else None

            # "not polled yet" comes first; the reason that counts is the hang the agent saw
            wait_for(hung_pool, 120, "the hung pool to show unreachable because it hangs")
            assert all(server.task(t, alice)["state"] in ("queued", "placed") for t in stuck)

            estate.hang.unlink()  # it answers again
            for task_id in stuck:
                task = server.wait_state(task_id, token=alice, timeout=240)
                assert task["state"] == "completed", task
                # never two jobs
                assert len(jobs_named(f"klique-{task_id}", estate.job_roots[1])) <= 1
        finally:
            stop_server(server)
