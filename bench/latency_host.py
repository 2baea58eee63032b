"""Submit -> running on the host pool, median of 20, beside a bare process start."""

from __future__ import annotations

import subprocess
import sys
import time

from _common import klique_server, last_line, median

RUNS = 20


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
    with klique_server() as (api, _home):
        for i in range(RUNS):
            t0 = time.time()
            task = api.post(
                "/tasks",
                json={
                    "command": [sys.executable, "-c", "import time; time.sleep(0.5)"],
                    "name": f"latency-{i}",
                },
            ).json()
            while True:
                seen = api.get(f"/tasks/{task['id']}").json()
                if seen["started_at"]:
                    latencies.append(seen["started_at"] - t0)
                    break
                if seen["state"] in ("failed", "lost", "cancelled"):
                    raise SystemExit(f"task {task['id']} {seen['state']}: {seen['reason']}")
                time.sleep(0.005)
            print(f"run {i + 1:2d}: submit -> running {latencies[-1] * 1000:6.1f} ms", flush=True)
    result = {
        "median_submit_to_running_s": median(latencies),
        "runs": RUNS,
        "bare_process_start_s": median(baseline),
        "ratio_to_bare_process": round(median(latencies) / median(baseline), 2),
    }
    last_line(result)


if __name__ == "__main__":
    main()
