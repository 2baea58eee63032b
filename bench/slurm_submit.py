"""500 tasks through Klique (submit -> sbatch accepted) against a plain loop of 500 sbatch on the
same Slurm cluster, in the same run. Every job is held, and cancelled after each half.

Klique's rate counts from the first POST to the moment the API lists every task with a native
job id. The loop runs `runuser -u alice -- sbatch --parsable --hold --wrap true`, the account and
mechanism Klique uses on this host. Last line: {"tasks", "klique_per_s", "sbatch_loop_per_s",
"ratio", ...}. Usage: bench/slurm_submit.py [TASKS] (default 500).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from _common import klique_server, last_line, slurm_estate

TASKS = int(sys.argv[1]) if len(sys.argv) > 1 else 500
ACCOUNT = "alice"
WORK = Path(os.environ.get("KLIQUE_SLURM_DIR", "/tmp/klique-slurm")) / "work"
POST_THREADS = 8
SUBMIT_CONCURRENCY = int(os.environ.get("KLIQUE_BENCH_SUBMIT_CONCURRENCY", "8"))
NOT_YET = "created,queued,placed"


def estate(job_root: Path) -> str:
    return slurm_estate(
        job_root,
        ACCOUNT,
        poll_interval="60s",
        max_queued=TASKS * 2,
        submit_concurrency=SUBMIT_CONCURRENCY,
        extra_directives='["--hold"]',
    )


def active(job_ids: list[str]) -> set[str]:
    """Which of these jobs are still pending or running."""
    found: set[str] = set()
    for start in range(0, len(job_ids), 200):
        chunk = ",".join(job_ids[start : start + 200])
        done = subprocess.run(
            ["squeue", "--noheader", "--states=PD,R,CG", f"--jobs={chunk}", "--format=%i"],
            capture_output=True,
            text=True,
            check=False,
        )
        found.update(done.stdout.split())
    return found


def cancel_and_drain(job_ids: list[str], what: str) -> None:
    """Cancel exactly these jobs (other people's jobs on the cluster are left alone)."""
    for start in range(0, len(job_ids), 200):
        subprocess.run(["scancel", *job_ids[start : start + 200]], check=False)
    deadline = time.monotonic() + 300
    while left := active(job_ids):
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(left)} of the {what} jobs are still queued after scancel")
        time.sleep(0.5)


def sbatch_loop(job_root: Path) -> tuple[float, list[str]]:
    argv = ["runuser", "-u", ACCOUNT, "--", "sbatch", "--parsable", "--hold"]
    argv += ["--job-name=bench-raw", f"--output={job_root}/raw-%j.out", "--wrap", "true"]
    ids = []
    t0 = time.perf_counter()
    for _ in range(TASKS):
        done = subprocess.run(argv, capture_output=True, text=True, cwd=WORK, check=False)
        if done.returncode != 0:
            raise SystemExit(f"sbatch failed: {done.stderr.strip()}")
        ids.append(done.stdout.strip().split(";")[0])
    return time.perf_counter() - t0, ids


def through_klique(job_root: Path) -> tuple[float, float, list[str]]:
    """(seconds to all submitted, seconds to post them all, native ids)."""
    with klique_server(estate(job_root)) as (api, _home):
        body = {"command": ["true"], "name": "bench"}

        def post(_: int) -> None:
            answer = api.post("/tasks", json=body)
            if answer.status_code != 201:
                raise SystemExit(f"POST /tasks: {answer.status_code} {answer.text}")

        t0 = time.perf_counter()
        with ThreadPoolExecutor(POST_THREADS) as threads:
            list(threads.map(post, range(TASKS)))
        posted = time.perf_counter() - t0
        while api.get("/tasks", params={"state": NOT_YET, "limit": 1}).json():
            time.sleep(0.05)
        elapsed = time.perf_counter() - t0
        tasks = api.get("/tasks", params={"limit": TASKS * 2}).json()
    ids = [t["native_id"] for t in tasks if t["native_id"]]
    failed = [t for t in tasks if not t["native_id"]]
    if failed or len(tasks) != TASKS:
        raise SystemExit(f"{len(failed)} tasks have no job: {failed[:1]}")
    return elapsed, posted, ids


def main() -> None:
    job_root = WORK / f"bench-submit-{os.getpid()}"
    job_root.mkdir(mode=0o1777)
    os.chmod(job_root, 0o1777)
    try:
        loop_s, raw_ids = sbatch_loop(job_root)
        print(f"sbatch loop: {TASKS} jobs in {loop_s:.2f} s", flush=True)
        cancel_and_drain(raw_ids, "sbatch loop")
        klique_s, posted_s, klique_ids = through_klique(job_root)
        print(f"klique: {TASKS} tasks posted in {posted_s:.2f} s, in sbatch after {klique_s:.2f} s")
        cancel_and_drain(klique_ids, "Klique")
    except httpx.HTTPError as exc:
        raise SystemExit(f"the Klique server failed: {exc}") from exc
    finally:
        subprocess.run(["rm", "-rf", str(job_root)], check=False)
    klique_rate, loop_rate = TASKS / klique_s, TASKS / loop_s
    last_line(
        {
            "tasks": TASKS,
            "klique_per_s": round(klique_rate, 1),
            "sbatch_loop_per_s": round(loop_rate, 1),
            "ratio": round(klique_rate / loop_rate, 2),
            "klique_post_s": round(posted_s, 2),
            "submit_concurrency": SUBMIT_CONCURRENCY,
        }
    )


if __name__ == "__main__":
    main()
