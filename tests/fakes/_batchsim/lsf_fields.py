"""bjobs -o fields: one value per job, as IBM Spectrum LSF 10.1 prints them.

IBM Spectrum LSF 10.1 Command Reference, bjobs "-o" (field names, case-insensitive,
"field[:width]" and "delimiter='c'"), "-json" (all values strings, "" where the text
output shows "-"), job states PEND PSUSP RUN USUSP SSUSP DONE EXIT UNKWN ZOMBI, and the
termination reasons TERM_OWNER ("job killed by owner") and TERM_RUNLIMIT ("job killed
after reaching LSF run time limit"); times as "Nov 29 20:51", a finish time suffixed
" L" once known and " E" while estimated. An array's element is shown under its array's
number, with its index in "jobindex" (0 for a job outside an array) and its name as
"name[index]" (bjobs "-o" jobindex; LSB_BJOBS_DISPLAY_ENH, default N: the JOBID column
without the index).
"""

from __future__ import annotations

from collections.abc import Callable

from .common import lsf_time
from .flavors import lsf_exit_code
from .state import DONE, QUEUED, RUNNING

PEND_REASONS = {
    "ncpus": "Not enough job slot(s)",
    "ngpus": "Not enough GPU resources",
    "mem": "Job requirements for reserving resource (mem) not satisfied",
}


def stat(job: dict) -> str:
    if job["state"] == QUEUED:
        return "PSUSP" if job.get("held") else "PEND"
    if job["state"] == RUNNING:
        return "RUN"
    return "DONE" if lsf_exit_code(job) == 0 and not job["kill"] else "EXIT"


def _exec_host(job: dict) -> str:
    if not job["exec_host"]:
        return ""
    return f"{job['ncpus']}*{job['exec_host']}" if job["ncpus"] > 1 else job["exec_host"]


def _exit_code(job: dict) -> str:
    if job["state"] != DONE or stat(job) == "DONE" or lsf_exit_code(job) is None:
        return ""
    return str(lsf_exit_code(job))


def _exit_reason(job: dict) -> str:
    if job["state"] != DONE:
        return ""
    return {
        "cancel": "TERM_OWNER: job killed by owner",
        "walltime": "TERM_RUNLIMIT: job killed after reaching LSF run time limit",
        "preempt": "TERM_PREEMPT: job killed after preemption",
    }.get(job["kill"] or "", "")


def _pend_reason(job: dict) -> str:
    if job["state"] != QUEUED:
        return ""
    if job.get("held"):
        return "The job was suspended by user while pending"
    if not job.get("pending"):
        return "New job is waiting for scheduling"
    return PEND_REASONS[job["pending"][0]]


def _finish_time(job: dict) -> str:
    if job["state"] == DONE:
        return lsf_time(job["end_time"], "L")
    if job["state"] == RUNNING and job["walltime"] is not None and job["start_time"]:
        return lsf_time(job["start_time"] + job["walltime"], "E")
    return ""


def _run_time(job: dict, now: float) -> str:
    if not job["launch_time"]:
        return "0 second(s)"
    return f"{int((job['end_time'] or now) - job['launch_time'])} second(s)"


def _pend_time(job: dict, now: float) -> str:
    return str(int((job["start_time"] or now) - job["submit_time"]))


def _home_relative(path: str, home: str) -> str:
    if home and home != "/" and (path == home or path.startswith(home + "/")):
        return "$HOME" + path[len(home) :]
    return path


def _runtimelimit(job: dict) -> str:
    minutes = job["native"].get("runlimit_minutes")
    return f"{minutes:.1f}" if minutes else ""


def _time_left(job: dict, now: float) -> str:
    if job["state"] != RUNNING or job["walltime"] is None or not job["launch_time"]:
        return ""
    left = max(0, int(job["launch_time"] + job["walltime"] - now))
    return f"{left // 3600}:{left % 3600 // 60:02d} L"


def _resreq(job: dict) -> str:
    text = "select[type == local] order[r15s:pg] "
    if job["mem_mb"]:
        text += f"rusage[mem={job['mem_mb']:.2f}] "
    return text


def _started(job: dict, value: str) -> str:
    return value if job["start_time"] else ""


FIELDS: dict[str, Callable[[dict, dict, float], str]] = {
    "jobid": lambda j, c, n: str(j["array"]["id"] if j.get("array") else j["id"]),
    "jobindex": lambda j, c, n: str(j["array"]["index"] if j.get("array") else 0),
    "stat": lambda j, c, n: stat(j),
    "user": lambda j, c, n: j["owner"],
    "user_group": lambda j, c, n: "",
    "queue": lambda j, c, n: j["queue"],
    "job_name": lambda j, c, n: j["name"],
    "job_description": lambda j, c, n: "",
    "proj_name": lambda j, c, n: j.get("project") or "default",
    "application": lambda j, c, n: "",
    "job_priority": lambda j, c, n: "",
    "dependency": lambda j, c, n: "",
    "command": lambda j, c, n: j["native"]["command"] or j["name"],
    "pids": lambda j, c, n: str(j["pid"]) if j["state"] == RUNNING and j["pid"] else "",
    "exit_code": lambda j, c, n: _exit_code(j),
    "exit_reason": lambda j, c, n: _exit_reason(j),
    "kill_reason": lambda j, c, n: j.get("kill_reason") or "",
    "pend_reason": lambda j, c, n: _pend_reason(j),
    "suspend_reason": lambda j, c, n: "",
    "from_host": lambda j, c, n: j["submit_host"],
    "first_host": lambda j, c, n: j["exec_host"] or "",
    "exec_host": lambda j, c, n: _exec_host(j),
    "nexec_host": lambda j, c, n: _started(j, "1"),
    "alloc_slot": lambda j, c, n: _exec_host(j),
    "nalloc_slot": lambda j, c, n: _started(j, str(j["ncpus"])),
    "nreq_slot": lambda j, c, n: str(j["ncpus"]),
    "slots": lambda j, c, n: _started(j, str(j["ncpus"])),
    "submit_time": lambda j, c, n: lsf_time(j["submit_time"]),
    "start_time": lambda j, c, n: lsf_time(j["start_time"]),
    "finish_time": lambda j, c, n: _finish_time(j),
    "run_time": lambda j, c, n: _run_time(j, n),
    "pend_time": lambda j, c, n: _pend_time(j, n),
    "cpu_used": lambda j, c, n: "0.0 second(s)",
    "runtimelimit": lambda j, c, n: _runtimelimit(j),
    "time_left": lambda j, c, n: _time_left(j, n),
    "mem": lambda j, c, n: "",
    "max_mem": lambda j, c, n: "",
    "avg_mem": lambda j, c, n: "",
    "swap": lambda j, c, n: "",
    "memlimit": lambda j, c, n: (
        f"{j['native']['memlimit']} M" if j["native"].get("memlimit") else ""
    ),
    "effective_resreq": lambda j, c, n: _resreq(j),
    "output_file": lambda j, c, n: j["native"].get("output_file") or "",
    "error_file": lambda j, c, n: j["native"].get("error_file") or "",
    "sub_cwd": lambda j, c, n: _home_relative(j["submit_cwd"], j["home"]),
    "exec_cwd": lambda j, c, n: _started(j, j["workdir"]),
    "exec_home": lambda j, c, n: _started(j, j["home"]),
    "gpu_num": lambda j, c, n: str(j["ngpus"]) if j["ngpus"] else "",
    "gpu_alloc": lambda j, c, n: (
        f"{j['exec_host']}:{','.join(str(g) for g in j['gpus'])}"
        if j["gpus"] and j["start_time"]
        else ""
    ),
}
DEFAULT_FIELDS = [
    "jobid",
    "user",
    "stat",
    "queue",
    "from_host",
    "exec_host",
    "job_name",
    "submit_time",
]
