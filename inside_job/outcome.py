"""How a task ended, as the exit.json object: exit code, outcome, reason and signal."""

from __future__ import annotations

import os
import signal
import time

from inside_job.jobfiles import PREEMPTED_MARKER

TERMINATED_REASON = "terminated by SIGTERM (cancelled, preempted or out of walltime)"
# The signal a scheduler sends at the run limit, long before it kills the job: LSF sends
# SIGUSR2 and kills ten minutes later (bsub -W). Once it arrives the task has run past its
# walltime, however it ends afterwards.
RUN_LIMIT_WARNING = {"lsf": signal.SIGUSR2}
RUN_LIMIT_REASON = "ran past its walltime (LSF's run limit sent SIGUSR2)"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def preempted(job_dir: str) -> bool:
    """The scheduler's side marked this stop as a preemption (environment or marker file)."""
    if os.environ.get("KLIQUE_PREEMPTED") == "1":
        return True
    return os.path.exists(os.path.join(job_dir, PREEMPTED_MARKER))


def result(exit_code: int, outcome: str, reason: str, signum: int | None = None) -> dict:
    return {"exit_code": exit_code, "outcome": outcome, "reason": reason, "signal": signum}


def stopped(signum: int, exit_code: int, job_dir: str, run_limit: int | None = None) -> dict:
    """The task was ended by a signal sent to the runner (SIGTERM from the scheduler, SIGINT,
    or the scheduler's run-limit warning where it has one)."""
    if signum == run_limit:
        return result(exit_code, "timeout", RUN_LIMIT_REASON, signum)
    if signum == signal.SIGTERM:
        if preempted(job_dir):
            return result(exit_code, "preempted", "preempted by the scheduler (SIGTERM)", signum)
        return result(exit_code, "signalled", TERMINATED_REASON, signum)
    return result(exit_code, "signalled", f"interrupted by {signal_name(signum)}", signum)


def classify(
    wait_status: int, stop_signal: int | None, job_dir: str, run_limit: int | None = None
) -> dict:
    """Turn a raw wait status into exit.json fields; the exit code follows the shell (128+N)."""
    if os.WIFSIGNALED(wait_status):
        signum = os.WTERMSIG(wait_status)
        exit_code = 128 + signum
    else:
        signum = None
        exit_code = os.WEXITSTATUS(wait_status)
    if stop_signal is not None:
        return stopped(stop_signal, exit_code, job_dir, run_limit)
    if signum is not None:
        hint = " (out of memory, or killed by the scheduler)" if signum == signal.SIGKILL else ""
        return result(exit_code, "signalled", f"killed by {signal_name(signum)}{hint}", signum)
    if exit_code == 0:
        return result(0, "completed", "exited with code 0")
    said = task_reason(job_dir)
    return result(
        exit_code, "failed", f"exited with code {exit_code}" + (f": {said}" if said else "")
    )


REASON_FILE = "reason.txt"  # the task's own word on why it failed (the SDK writes it)


def task_reason(job_dir: str) -> str:
    """The first line of the task's reason.txt, printable and short, or ''."""
    try:
        with open(os.path.join(job_dir, REASON_FILE), "rb") as f:
            data = f.read(1000)
    except OSError:
        return ""
    line = data.decode("utf-8", "replace").strip().split("\n", 1)[0]
    return "".join(c if c.isprintable() else " " for c in line)[:500]


def stamp(res: dict, started: float | None) -> dict:
    return dict(res, started=started, finished=time.time())
