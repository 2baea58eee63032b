"""Submit -> running and submit -> done on the Slurm cluster, median of 20 each, beside the same
figures for a bare sbatch.

Running. Bare sbatch: from the call to the moment the job's first command runs (it writes the
time). Klique: from the POST to the task's RUNNING stamp (the runner reports as it starts the
command); beside it, from the POST to sbatch's acceptance (Klique's own share of the wait).

Done, for a job that runs `true`. Bare sbatch: from the call until squeue, asked every 0.1 s,
no longer lists the job pending, running or completing. Klique: from the POST until the API,
asked every 0.1 s, shows the task completed, with the pool's default `poll_interval` (10 s):
the runner's end report is a claim, final once the pool has seen the job end.

Last line: {"klique_median_s": ..., "sbatch_median_s": ..., "klique_done_median_s": ...,
"sbatch_done_median_s": ..., ...}.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
from _common import klique_server, last_line, median, slurm_estate

RUNS = 20
ACCOUNT = "alice"
WORK = Path(os.environ.get("KLIQUE_SLURM_DIR", "/tmp/klique-slurm")) / "work"
TIMEOUT_S = 120
POLL_S = 0.1
ACTIVE = "PENDING,RUNNING,COMPLETING,CONFIGURING,SUSPENDED,REQUEUED,RESIZING"


def estate(job_root: Path) -> str:
    return slurm_estate(job_root, ACCOUNT, poll_interval="2s")


def sbatch(job_root: Path, name: str, command: str) -> tuple[float, str]:
    """A bare job running `command` as the account: when sbatch was called, and the job's id."""
    argv = ["runuser", "-u", ACCOUNT, "--", "sbatch", "--parsable", f"--job-name={name}"]
    argv += [f"--output={job_root}/{name}-%j.out", "--wrap", command]
    t0 = time.time()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=WORK, check=False)
    if done.returncode != 0:
        raise SystemExit(f"sbatch failed: {done.stderr.strip()}")
    return t0, done.stdout.strip().split(";")[0]


def bare_sbatch(job_root: Path, i: int) -> float:
    stamp = job_root / f"bare-{i}.start"
    t0, job = sbatch(job_root, "bench-latency", f"date +%s.%N > {stamp}")
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            text = stamp.read_text().strip()
        except FileNotFoundError:
            text = ""
        if text:
            return float(text) - t0
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job} did not start in {TIMEOUT_S} s")
        time.sleep(0.005)


def bare_sbatch_done(job_root: Path) -> float:
    t0, job = sbatch(job_root, "bench-done", "true")
    query = ["squeue", "--noheader", f"--jobs={job}", f"--states={ACTIVE}", "--format=%i"]
    deadline = time.monotonic() + TIMEOUT_S
    while subprocess.run(query, capture_output=True, text=True, check=False).stdout.strip():
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job} did not end in {TIMEOUT_S} s")
        time.sleep(POLL_S)
    return time.time() - t0


def klique_done(api: httpx.Client, i: int) -> float:
    t0 = time.time()
    task = api.post("/tasks", json={"command": ["true"], "name": f"done-{i}"}).json()
    deadline = time.monotonic() + TIMEOUT_S
    while (seen := api.get(f"/tasks/{task['id']}").json())["state"] != "completed":
        if seen["state"] in ("failed", "lost", "cancelled", "timeout"):
            raise SystemExit(f"task {task['id']} {seen['state']}: {seen['reason']}")
        if time.monotonic() > deadline:
            raise SystemExit(f"task {task['id']} did not end in {TIMEOUT_S} s")
        time.sleep(POLL_S)
    return time.time() - t0


def main() -> None:
    job_root = WORK / f"bench-latency-{os.getpid()}"
    job_root.mkdir(mode=0o1777)
    os.chmod(job_root, 0o1777)
    try:
        bare = []
        for i in range(RUNS):
            bare.append(bare_sbatch(job_root, i))
            print(f"sbatch {i + 1:2d}: submit -> running {bare[-1] * 1000:7.1f} ms", flush=True)
        klique, accepted = [], []
        with klique_server(estate(job_root)) as (api, _home):
            for i in range(RUNS):
                t0 = time.time()
                task = api.post("/tasks", json={"command": ["true"], "name": f"lat-{i}"}).json()
                deadline = time.monotonic() + TIMEOUT_S
                while True:
                    seen = api.get(f"/tasks/{task['id']}").json()
                    if seen["started_at"]:
                        klique.append(seen["started_at"] - t0)
                        accepted.append(seen["submitted_at"] - t0)
                        break
                    if seen["state"] in ("failed", "lost", "cancelled", "timeout"):
                        raise SystemExit(f"task {task['id']} {seen['state']}: {seen['reason']}")
                    if time.monotonic() > deadline:
                        raise SystemExit(f"task {task['id']} did not start in {TIMEOUT_S} s")
                    time.sleep(0.005)
                shown = f"{klique[-1] * 1000:7.1f} ms"
                print(f"klique {i + 1:2d}: submit -> running {shown}", flush=True)
        bare_done, klique_ended = [], []
        for i in range(RUNS):
            bare_done.append(bare_sbatch_done(job_root))
            print(f"sbatch {i + 1:2d}: submit -> done {bare_done[-1]:6.2f} s", flush=True)
        with klique_server(slurm_estate(job_root, ACCOUNT)) as (api, _home):
            for i in range(RUNS):
                klique_ended.append(klique_done(api, i))
                print(f"klique {i + 1:2d}: submit -> done {klique_ended[-1]:6.2f} s", flush=True)
    finally:
        subprocess.run(["rm", "-rf", str(job_root)], check=False)
    last_line(
        {
            "klique_median_s": median(klique),
            "sbatch_median_s": median(bare),
            "klique_post_to_sbatch_accepted_median_s": median(accepted),
            "runs": RUNS,
            "klique_minus_sbatch_s": round(median(klique) - median(bare), 4),
            "klique_done_median_s": median(klique_ended),
            "sbatch_done_median_s": median(bare_done),
            "klique_done_max_s": round(max(klique_ended), 3),
        }
    )


if __name__ == "__main__":
    main()
