"""One slow pool never delays another, measured: submit -> running on two healthy pools (the
real Slurm cluster and a host pool), median of 20 each, without and then with a third pool
whose scheduler commands hang (the same cluster behind a login node whose sbatch and squeue
wait), in one run. The hung pool's tasks are submitted first and keep it busy throughout.

Last line: {"healthy_ratio": ..., "without_hung_s": {...}, "with_hung_s": {...}}, where
healthy_ratio = with / without (both pools together; 1.0 means the hung pool cost nothing).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import httpx  # noqa: E402
from _common import klique_server, last_line, median  # noqa: E402
from conftest_services import SSHEndpoint  # noqa: E402
from helpers.isolation import estate_with_a_hung_pool  # noqa: E402

RUNS = 20
SLURM = Path(os.environ.get("KLIQUE_SLURM_DIR", "/tmp/klique-slurm"))
SSH = Path(os.environ.get("KLIQUE_SSH_DIR", "/tmp/klique-ssh"))


class Cluster:
    work = SLURM / "work"


def latency(api: httpx.Client, resource: str) -> float:
    """Seconds from the POST to the task's running stamp (the runner reports as it starts)."""
    t0 = time.time()
    answer = api.post("/tasks", json={"command": ["true"], "resource": resource})
    answer.raise_for_status()
    task_id = answer.json()["id"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        task = api.get(f"/tasks/{task_id}").json()
        if task["started_at"]:
            return float(task["started_at"]) - t0
        if task["state"] in ("failed", "lost", "cancelled", "timeout"):
            raise SystemExit(f"task {task_id} ended {task['state']}: {task['reason']}")
        time.sleep(0.01)
    raise SystemExit(f"task {task_id} on {resource} did not start within 120 s")


def measure(hung: bool) -> dict[str, float]:
    shared = SSHEndpoint("127.0.0.1", 2222, SSH / "known_hosts", SSH / "client_key", ())
    with estate_with_a_hung_pool(Cluster, shared, hung) as estate:
        if hung:
            estate.hang.touch()
        with klique_server(estate.text) as (admin, _home):
            token = admin.post("/tokens", json={"user": "alice"}).json()["token"]
            with httpx.Client(
                base_url=str(admin.base_url), headers={"Authorization": f"Bearer {token}"}
            ) as api:
                if hung:  # its agent is busy with these all along: submissions and polls hang
                    for _ in range(4):
                        api.post("/tasks", json={"command": ["true"], "resource": "stuck"})
                figures: dict[str, Any] = {}
                for resource in ("fast", "local"):
                    figures[resource] = median([latency(api, resource) for _ in range(RUNS)])
                return figures


def main() -> None:
    without = measure(hung=False)
    print(f"without a hung pool: {without}", flush=True)
    with_hung = measure(hung=True)
    print(f"with a hung pool:    {with_hung}", flush=True)
    ratio = sum(with_hung.values()) / sum(without.values())
    last_line(
        {"healthy_ratio": round(ratio, 3), "without_hung_s": without, "with_hung_s": with_hung}
    )


if __name__ == "__main__":
    main()
