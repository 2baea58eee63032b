"""Submit -> running on the host pool, median of 20, beside a bare process start."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import klique_server, last_line, median

RUNS = 20
DEADLINE_S = 60.0  # for one task to start
# A server run as root runs no task as root: its host pool runs the admin's tasks as alice
# (scripts/test-users), in a job root every account can enter.
AS_ROOT = """
resources:
  cpu: {{profile: {{cpus: 1, memory: 200M, walltime: 10m, pools: [local]}}}}
pools:
  local:
    kind: host
    slots: 4
    user_map: {{admin: alice}}
    job_root: {job_root}
"""


def bare_start() -> float:
    """Baseline: spawn the same interpreter and wait for its first line."""
    t0 = time.perf_counter()
    with subprocess.Popen(
        [sys.executable, "-c", "print('up', flush=True)"], stdout=subprocess.PIPE
    ) as p:
        assert p.stdout is not None
        p.stdout.readline()
    return time.perf_counter() - t0


def main() -> None:
    baseline = [bare_start() for _ in range(RUNS)]
    latencies = []
    python = "/usr/bin/python3" if os.geteuid() == 0 else sys.executable
    with tempfile.TemporaryDirectory(prefix="klique-latency-") as job_root:
        os.chmod(job_root, 0o1777)
        estate = AS_ROOT.format(job_root=job_root) if os.geteuid() == 0 else None
        with klique_server(estate) as (api, _home):
            for i in range(RUNS):
                latencies.append(submit_to_running(api, python, i))
                shown = latencies[-1] * 1000
                print(f"run {i + 1:2d}: submit -> running {shown:6.1f} ms", flush=True)
    result = {
        "median_submit_to_running_s": median(latencies),
        "runs": RUNS,
        "bare_process_start_s": median(baseline),
        "ratio_to_bare_process": round(median(latencies) / median(baseline), 2),
    }
    last_line(result)


def submit_to_running(api: Any, python: str, i: int) -> float:
    t0 = time.time()
    body = {"command": [python, "-c", "import time; time.sleep(0.5)"], "name": f"latency-{i}"}
    task = api.post("/tasks", json=body).json()
    while time.time() < t0 + DEADLINE_S:
        seen = api.get(f"/tasks/{task['id']}").json()
        if seen["started_at"]:
            return float(seen["started_at"] - t0)
        if seen["state"] in ("failed", "lost", "cancelled"):
            raise SystemExit(f"task {task['id']} {seen['state']}: {seen['reason']}")
        time.sleep(0.005)
    raise SystemExit(f"task {task['id']} not running after {DEADLINE_S:g} s: {seen['reason']}")


if __name__ == "__main__":
    main()
