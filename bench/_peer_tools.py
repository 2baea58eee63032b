"""The peers' half of bench/peers_slurm.py: run as the submitting account (not root), with a
Python that has submitit and psij-python, it submits TASKS trivial jobs through one tool, waits
for them the way that tool's users do, and prints one JSON line: {"accepted_s", "done_s",
"jobs", "failed"}. Progress goes to stderr.

Usage: _peer_tools.py TOOL TASKS NAME FOLDER, TOOL one of submitit_loop, submitit_map_array,
psij. Every job is named NAME (so the caller can cancel exactly these) and asks for what the
other tools ask for: partition debug, one CPU, 100 MB, ten minutes.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

PARTITION = "debug"
MEMORY_MB = 100
WALLTIME_MIN = 10
POLL_S = 0.5
DEADLINE_S = 900


def trivial(_: int = 0) -> None:
    print("done")


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def wait_all(jobs: list[Any], done: Callable[[Any], bool], what: str) -> None:
    """Ask the tool about every job not yet done until it says all are (or the deadline)."""
    pending, deadline = list(jobs), time.monotonic() + DEADLINE_S
    while pending:
        pending = [job for job in pending if not done(job)]
        if pending and time.monotonic() > deadline:
            raise SystemExit(f"{what}: {len(pending)} jobs not done after {DEADLINE_S} s")
        if pending:
            time.sleep(POLL_S)


def submitit_executor(name: str, folder: Path) -> Any:
    import submitit

    executor = submitit.AutoExecutor(folder=folder / "submitit" / "%j", cluster="slurm")
    executor.update_parameters(
        name=name,
        slurm_partition=PARTITION,
        cpus_per_task=1,
        slurm_mem=f"{MEMORY_MB}M",
        timeout_min=WALLTIME_MIN,
    )
    return executor


def submitit_run(tasks: int, name: str, folder: Path, array: bool) -> dict[str, Any]:
    executor = submitit_executor(name, folder)
    t0 = time.perf_counter()
    if array:
        jobs = executor.map_array(trivial, range(tasks))
    else:
        jobs = [executor.submit(trivial, i) for i in range(tasks)]
    accepted = time.perf_counter() - t0
    say(f"  {len(jobs)} jobs accepted after {accepted:.2f} s; waiting with job.done()")
    wait_all(jobs, lambda job: job.done(), "submitit")
    done = time.perf_counter() - t0
    ids = [job.job_id for job in jobs]
    failed = [job.job_id for job in jobs if job.exception() is not None]
    return {"accepted_s": accepted, "done_s": done, "jobs": ids, "failed": failed}


def psij_run(tasks: int, name: str, folder: Path) -> dict[str, Any]:
    from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState, ResourceSpecV1
    from psij.executors.batch.slurm import SlurmExecutorConfig

    config = SlurmExecutorConfig(work_directory=folder / "psij")
    executor = JobExecutor.get_instance("slurm", config=config)
    resources = ResourceSpecV1(process_count=1, cpu_cores_per_process=1, memory=MEMORY_MB << 20)
    attributes = JobAttributes(
        duration=timedelta(minutes=WALLTIME_MIN),
        queue_name=PARTITION,
        custom_attributes={"slurm.job-name": name},  # PSI/J's template names jobs after the file
    )
    spec = JobSpec(
        executable="true", name=name, resources=resources, attributes=attributes, directory=folder
    )
    jobs = [Job(spec) for _ in range(tasks)]
    t0 = time.perf_counter()
    for job in jobs:
        executor.submit(job)
    accepted = time.perf_counter() - t0
    say(f"  {len(jobs)} jobs accepted after {accepted:.2f} s; waiting with job.wait()")
    ends = [job.wait(timeout=timedelta(seconds=DEADLINE_S)) for job in jobs]
    done = time.perf_counter() - t0
    if any(end is None for end in ends):
        raise SystemExit(f"psij: jobs not done after {DEADLINE_S} s")
    ids = [job.native_id for job in jobs]
    failed = [i for i, end in zip(ids, ends, strict=True) if end.state != JobState.COMPLETED]
    return {"accepted_s": accepted, "done_s": done, "jobs": ids, "failed": failed}


def main() -> None:
    tool, tasks, name, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    if tool == "psij":
        result = psij_run(tasks, name, folder)
    elif tool in ("submitit_loop", "submitit_map_array"):
        result = submitit_run(tasks, name, folder, array=tool == "submitit_map_array")
    else:
        raise SystemExit(f"unknown tool {tool!r}: submitit_loop, submitit_map_array or psij")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
