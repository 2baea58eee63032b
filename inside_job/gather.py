"""The end of a task on several nodes: the batch script's last step, once every node's runner
has ended, writes exit.json from the ranks' exit.rankN.json and reports it.

The task's outcome is the worst of its ranks': a rank that failed by itself (its command's
exit, its setup) comes first, then one that ran out of time or was preempted, then one that was
stopped by a signal (as the launcher stops the others when one fails: srun
--kill-on-bad-exit), then a rank that left no exit file at all; the lowest rank among equals.
The reason names the rank.
"""

from __future__ import annotations

import json
import os
import time

from inside_job import jobfiles, outcome

# Lower is worse: the rank whose ending explains the task's.
_ORDER = {"setup_failed": 0, "failed": 0, "timeout": 1, "preempted": 2, "signalled": 3}
_MISSING = 4


def read_rank(job_dir: str, rank: int) -> dict | None:
    """One rank's exit file, or None where it wrote none (killed hard, or its node failed)."""
    try:
        with open(os.path.join(job_dir, jobfiles.rank_exit_file(rank)), encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("exit_code"), int) else None


def combine(ranks: list[dict | None]) -> dict:
    """The task's exit.json fields from its ranks' (rank i at index i)."""
    started = [r["started"] for r in ranks if r and isinstance(r.get("started"), (int, float))]
    if all(r is not None and r.get("outcome") == "completed" for r in ranks):
        done = outcome.result(0, "completed", f"exited with code 0 on all {len(ranks)} nodes")
    else:
        rank = min(range(len(ranks)), key=lambda i: (_severity(ranks[i]), i))
        done = _blamed(rank, ranks[rank])
    for key in ("environment",):
        if ranks and ranks[0] and key in ranks[0]:
            done[key] = ranks[0][key]
    done["ranks"] = [_summary(r) for r in ranks]
    return dict(done, started=min(started) if started else None, finished=time.time())


def _severity(doc: dict | None) -> int:
    if doc is None:
        return _MISSING
    return _ORDER.get(str(doc.get("outcome")), 0 if doc.get("outcome") != "completed" else 9)


def _blamed(rank: int, doc: dict | None) -> dict:
    if doc is None:
        return outcome.result(
            125,
            "failed",
            f"rank {rank} wrote no exit file: its runner was killed hard, or its node failed "
            f"(see console.rank{rank}.log)"
            if rank
            else "rank 0 wrote no exit file",
        )
    return outcome.result(
        int(doc["exit_code"]),
        str(doc.get("outcome") or "failed"),
        f"rank {rank}: {doc.get('reason') or 'no reason given'}",
        doc.get("signal") if isinstance(doc.get("signal"), int) else None,
    )


def _summary(doc: dict | None) -> dict | None:
    if doc is None:
        return None
    return {k: doc.get(k) for k in ("exit_code", "outcome", "reason")}


def gather(job_dir: str) -> int:
    """Write exit.json for the task of job_dir and report it; returns the task's exit code."""
    from inside_job import spec as task_spec  # on its path only: every job starts the runner

    job_dir = os.path.abspath(job_dir)
    try:
        spec = task_spec.load(job_dir)
    except task_spec.SpecError as exc:
        final = outcome.result(exc.exit_code, "setup_failed", exc.reason)
        jobfiles.write_exit(job_dir, dict(final, started=None, finished=time.time()))
        return exc.exit_code
    final = combine([read_rank(job_dir, rank) for rank in range(spec.nodes)])
    jobfiles.write_exit(job_dir, final)
    jobfiles.write_status(job_dir, jobfiles.status("done"))
    if final["outcome"] != "completed":
        console = jobfiles.Console(job_dir)
        console.say(f"the task ended: {final['reason']}")
        console.close()
    if spec.report is not None:
        from inside_job.reporter import Reporter  # on its path only: every job starts the runner

        reporter = Reporter(spec.report.url, spec.report.token, spec.id, job_dir)
        reporter.state(jobfiles.status("done"))
        reporter.close(final)
    return int(final["exit_code"])
