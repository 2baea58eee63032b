"""PBS Professional's and Torque's words, read: their job states and exit codes as literal
tables citing the manuals, and pure parsers of what qsub and qstat print (`qstat -f -F json`,
Torque's `qstat -f -1`). broker/pools/pbs.py runs the commands."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from broker.domain import TaskState
from broker.errors import SubmitError, TransportError
from broker.pools.native import NativeStatus, unreadable
from broker.pools.pbs_json import job_records

# PBS Professional 2022 Reference Guide, qstat(1B) "Job States" (job_state of
# pbs_job_attributes(7B)), and the TORQUE 6.1 Administrator Guide, qstat "job states".
# The finished states (PBS Professional F, X for a subjob; Torque C) are in PBS_ENDINGS.
PBS_STATES: dict[str, TaskState] = {
    "Q": TaskState.PENDING,  # queued, eligible to run or be routed
    "H": TaskState.PENDING,  # held
    "W": TaskState.PENDING,  # waiting for its execution time (qsub -a) or for stage-in
    "T": TaskState.PENDING,  # being moved to a new location
    "R": TaskState.RUNNING,  # running
    "S": TaskState.RUNNING,  # suspended; the allocation is kept
    "U": TaskState.RUNNING,  # PBS Professional: suspended while its workstation is busy
    "E": TaskState.RUNNING,  # exiting after having run: the exit file is not final yet
    "B": TaskState.RUNNING,  # PBS Professional: an array job with a subjob started
    "M": TaskState.LOST,  # PBS Professional: moved to another server, where this id is not valid
}

# Running jobs whose execution is suspended (qstat(1B): S by qsig -s suspend or preemption, U
# while its workstation is busy): not charged unless the pool's `charge_phases` names them, as
# Slurm's SUSPENDED and LSF's USUSP and SSUSP (one rule, docs/pbs-lsf-sites.md).
PBS_PHASES: dict[str, str] = {
    "S": "suspended",
    "U": "suspended",
}

# How a finished job ended, from its exit status (see `ending`).
PBS_ENDINGS: dict[str, TaskState] = {
    "completed": TaskState.COMPLETED,  # exit status 0
    "failed": TaskState.FAILED,  # 1-255: the job script's own exit status
    "signal": TaskState.FAILED,  # 256 + N: killed by signal N
    "deleted": TaskState.CANCELLED,  # qdel: no exit status (never ran), or SIGTERM while running
    "walltime": TaskState.TIMEOUT,  # killed by PBS for running past its walltime
    "memory": TaskState.FAILED,  # killed by PBS for going over its memory limit
    "limit": TaskState.FAILED,  # killed by PBS for going over a CPU limit
    "exec": TaskState.FAILED,  # PBS could not start or keep the job (other JOB_EXEC_* codes)
    # Substate 93 with no exit status: the job's MoM went down while it ran and the job was not
    # rerunnable (OpenPBS req_jobobit.c, on_job_exit; discard_job): nobody deleted it.
    "host": TaskState.LOST,
    # A subjob that ended and shows through its array (see `_status`): how is not kept.
    "ended": TaskState.COMPLETED,
}
FINISHED = ("F", "X", "C")  # PBS Professional F and X, Torque C
_WAITING = frozenset({"Q", "H", "W", "T"})  # states of a job that waits to run (again)

# PBS Professional Administrator's Guide, "Job Exit Status" (OpenPBS src/include/job.h). The
# MoM keeps these over the job's own status (catch_child.c). JOB_EXEC_KILL_* came with OpenPBS
# 22.05 and PBS Professional 2021.1; before, a limit kill is SIGTERM, then SIGKILL after
# kill_delay, and the job's own status is reported (271, 265, or 143 and even 0 when the
# script caught the signal): see `ending`.
PBSPRO_EXEC_CODES: dict[int, str] = {
    -24: "limit",  # JOB_EXEC_KILL_NCPUS_BURST
    -25: "limit",  # JOB_EXEC_KILL_NCPUS_SUM
    -26: "memory",  # JOB_EXEC_KILL_VMEM
    -27: "memory",  # JOB_EXEC_KILL_MEM
    -28: "limit",  # JOB_EXEC_KILL_CPUT
    -29: "walltime",  # JOB_EXEC_KILL_WALLTIME
}
# TORQUE 6.1 Administrator Guide, "Job Exit Status" (the JOB_EXEC_* table). Torque's qstat
# shows no substate, so a deletion is read from its exit status: qdel ends a running job with
# SIGTERM, reported as 256 + 15 when the signal killed it and as the script's own 128 + 15 when
# it caught the signal and exited (as the runner does; its exit file decides first).
TORQUE_EXEC_CODES: dict[int, str] = {
    -10: "memory",  # JOB_EXEC_OVERLIMIT_MEM: job exceeded a memory limit
    -11: "walltime",  # JOB_EXEC_OVERLIMIT_WT: job exceeded a walltime limit
    -12: "limit",  # JOB_EXEC_OVERLIMIT_CPUT: job exceeded a CPU time limit
    256 + 15: "deleted",  # killed by qdel's SIGTERM
    128 + 15: "deleted",  # caught qdel's SIGTERM and exited
}
# PBS Professional substates of a finished job (OpenPBS src/include/job.h; svr_jobfunc.c sets
# them when the job enters history): 91 deleted (qdel), 92 finished, 93 failed (non-zero, or
# its MoM went down: then with no Exit_status at all).
_SUBSTATE_TERMINATED = 91
_SUBSTATE_FAILED = 93
# The comment OpenPBS gives a finished subjob shown through its array (src/server/array_func.c,
# update_sj_parent and set_subjob_tblstate): "Subjob finished", "Subjob failed" (a non-zero
# exit), "Subjob terminated" (deleted).
_SUBJOB_ENDINGS: dict[str, str] = {
    "Subjob finished": "ended",
    "Subjob failed": "failed",
    "Subjob terminated": "deleted",
}

# Every state the parsers yield: the native states, and "<F|X|C>/<ending>" once finished.
PBS_ALL_STATES: dict[str, TaskState] = {
    **PBS_STATES,
    **{f"{code}/{end}": state for code in FINISHED for end, state in PBS_ENDINGS.items()},
}

_ENDING_REASONS: dict[str, str] = {
    "failed": "the job failed",
    "signal": "killed by a signal",
    "deleted": "deleted in PBS (qdel)",
    "walltime": "ran past its walltime (killed by PBS)",
    "memory": "went over its memory limit (killed by PBS)",
    "limit": "went over its CPU limit (killed by PBS)",
    "exec": "PBS could not run the job",
    "host": "its execution host went down and PBS did not rerun it (not rerunnable, qsub -r n)",
    "ended": "the subjob ended (PBS keeps no record of how without job history)",
}
PBS_REASONS: dict[str, str] = {
    "Q": "queued in PBS",
    "H": "held in PBS",
    "W": "waiting in PBS for its start time",
    "M": "moved to another PBS server",
    "S": "suspended in PBS",
    "U": "suspended in PBS while its workstation is busy",
    **{f"{code}/{end}": text for code in FINISHED for end, text in _ENDING_REASONS.items()},
}

_JOB_ID = re.compile(r"\d+(\[\d*\])?(\.[A-Za-z0-9_.-]+)?")
# PBS Professional job arrays (Reference Guide, qsub(1B) -J; User's Guide, "Job Arrays"): qsub
# prints the array job's id, `1000[].server`; a subjob is `1000[3].server`.
ARRAY_ID = re.compile(r"(\d+)\[\](\.[A-Za-z0-9_.-]+)?")
SUBJOB_ID = re.compile(r"(\d+)\[(\d+)\](\.[A-Za-z0-9_.-]+)?")

# One attribute line of `qstat -f` (Torque, or PBS Professional without -F json).
_ATTRIBUTE = re.compile(r"^(?:    |\t)([A-Za-z_][A-Za-z0-9_.]*) = (.*)$")


def array_of(native_id: str) -> str:
    """A subjob's array job (`1000[3].server` -> `1000[].server`); another id as it is."""
    match = SUBJOB_ID.fullmatch(native_id)
    return f"{match[1]}[]{match[3] or ''}" if match else native_id


def parse_qsub(stdout: str) -> str:
    """qsub(1B) prints the job id: `<sequence>.<server>` (Torque and PBS Professional)."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    job_id = lines[-1] if lines else ""
    if not _JOB_ID.fullmatch(job_id):
        raise SubmitError(f"qsub printed no job id: {stdout.strip()!r}")
    return job_id


def parse_qstat_json(stdout: str) -> list[NativeStatus]:
    """`qstat [-x] -f -F json`: {"Jobs": {id: attributes}}, no "Jobs" when nothing is shown.
    Known versions print invalid JSON for some jobs: see pbs_json; a job whose record does
    not read is listed as unreadable, and the others as usual."""
    try:
        jobs, problems = job_records(stdout)
    except ValueError as exc:
        raise TransportError(f"qstat -F json printed no readable JSON: {exc}") from exc
    found = [_readable(job_id, attrs, PBSPRO_EXEC_CODES) for job_id, attrs in jobs]
    return found + [unreadable(job_id, problem) for job_id, problem in problems]


def parse_qstat_text(stdout: str, exec_codes: Mapping[int, str]) -> list[NativeStatus]:
    """`qstat -f`: `Job Id: <id>` then `name = value` lines, indented by four spaces (a tab
    in Slurm's Torque wrapper); long values continue on lines that start with a tab (indented
    further where the output was copied with its tabs expanded)."""
    return [_readable(job_id, attrs, exec_codes) for job_id, attrs in qstat_text_jobs(stdout)]


def qstat_text_jobs(stdout: str) -> list[tuple[str, dict[str, str]]]:
    jobs: list[tuple[str, dict[str, str]]] = []
    last = ""
    for line in stdout.splitlines():
        if line.startswith("Job Id:"):
            jobs.append((line[len("Job Id:") :].strip(), {}))
            last = ""
            continue
        if not jobs or not line.strip():
            continue
        attrs = jobs[-1][1]
        match = _ATTRIBUTE.match(line)
        if match:
            last = match.group(1)
            attrs[last] = match.group(2)
        elif line[:1].isspace() and last:
            attrs[last] += line[1:] if line.startswith("\t") else line.lstrip()
    return jobs


def _readable(job_id: str, attrs: Any, exec_codes: Mapping[int, str]) -> NativeStatus:
    if not isinstance(attrs, Mapping) or not attrs.get("job_state"):
        return unreadable(job_id, "its record has no job_state")
    return _status(job_id, attrs, exec_codes)


def _status(job_id: str, attrs: Mapping[str, Any], exec_codes: Mapping[int, str]) -> NativeStatus:
    state = str(attrs.get("job_state", ""))
    name = _job_name(attrs)
    status = _int(attrs.get("Exit_status", attrs.get("exit_status")))
    script, user = _script(attrs), str(attrs.get("Job_Owner", "")).split("@")[0]
    restarts = requeues(state, attrs)
    if state not in FINISHED:
        comment = str(attrs.get("comment", ""))
        return NativeStatus(
            job_id, name, state, comment, script=script, user=user, restarts=restarts
        )
    if state in ("X", "F") and SUBJOB_ID.fullmatch(job_id) and "array_index" not in attrs:
        # A PBS Professional subjob without a job of its own (no job history): OpenPBS
        # status_subjob (stat_job.c) shows its array's record in state X, the comment
        # "Subjob finished" and the array's Exit_status (update_sj_parent: 0, 1 or 2 for the
        # last subjob to end), none of them this subjob's. The exit file tells; the comment
        # says whether it failed or was deleted, where it names either.
        comment = str(attrs.get("comment", "")).strip()
        end = next((e for c, e in _SUBJOB_ENDINGS.items() if comment.startswith(c)), "ended")
        return NativeStatus(job_id, name, f"{state}/{end}", comment, script=script, user=user)
    overran = _overran(attrs)
    end = ending(status, _int(attrs.get("substate")), exec_codes, overran)
    detail = "no exit status" if status is None else f"exit status {status}"
    if end == "walltime" and overran and status not in exec_codes:
        detail += ", walltime used past its limit"
    code = _exit_code(status)
    return NativeStatus(
        job_id, name, f"{state}/{end}", detail, code, script=script, user=user, restarts=restarts
    )


def requeues(state: str, attrs: Mapping[str, Any]) -> int | None:
    """How often the job was requeued (qrerun, a failed start): PBS Professional's run_count
    (pbs_job_attributes(7B)) counts the times the job was sent to run (OpenPBS req_runjob.c
    svr_strtjob2), so a job waiting again after its runs was requeued that many times, and one
    running or ended once fewer. None where qstat shows no run_count: a job that never ran, a
    subjob shown through its array, and Torque (its qstat shows start_count, which the TORQUE
    6.1 guide does not describe as a count of requeues: it is not read)."""
    runs = _int(attrs.get("run_count"))
    if runs is None:
        return None
    return max(runs - (0 if state in _WAITING else 1), 0)


def _job_name(attrs: Mapping[str, Any]) -> str:
    """The job's name; a Torque subjob's is its array's, with the "-<index>" that TORQUE's
    job_clone appends (its job_array_id is the index) taken off."""
    name = str(attrs.get("Job_Name", ""))
    index = attrs.get("job_array_id")
    return name.removesuffix(f"-{index}") if index is not None else name


def _script(attrs: Mapping[str, Any]) -> str:
    """The script's path where qsub was given nothing else: qstat prints Submit_arguments as
    the arguments joined by spaces (OpenPBS qstat.c, decode_xml_arg_list_str)."""
    words = str(attrs.get("Submit_arguments", "")).split()
    return words[0] if len(words) == 1 and words[0].startswith("/") else ""


def ending(
    status: int | None,
    substate: int | None,
    exec_codes: Mapping[int, str],
    overran: bool = False,
) -> str:
    """Which PBS_ENDINGS entry a finished job names. A deletion is read from the substate (91)
    where qstat shows one (PBS Professional, every version); a limit kill from the MoM's code,
    or (PBS Professional before JOB_EXEC_KILL_WALLTIME) from walltime used past its limit,
    since the MoM kills only once it is exceeded; then the job's own status. A failed job
    (93) with no status at all lost its host: it was never deleted."""
    if substate == _SUBSTATE_FAILED and status is None:
        return "host"
    if substate == _SUBSTATE_TERMINATED or status is None:
        return "deleted"
    if status < 0:
        return exec_codes.get(status, "exec")
    if overran:
        return "walltime"
    if status in exec_codes:
        return exec_codes[status]
    if status >= 256:
        return "signal"
    return "completed" if status == 0 else "failed"


def _overran(attrs: Mapping[str, Any]) -> bool:
    """resources_used.walltime past Resource_List.walltime (JSON nests them; text does not)."""
    used = _seconds(_resource(attrs, "resources_used", "walltime"))
    limit = _seconds(_resource(attrs, "Resource_List", "walltime"))
    return used is not None and limit is not None and used > limit


def _resource(attrs: Mapping[str, Any], group: str, name: str) -> object:
    nested = attrs.get(group)
    if isinstance(nested, Mapping):
        return nested.get(name)
    return attrs.get(f"{group}.{name}")


def _seconds(value: object) -> int | None:
    """[[HH:]MM:]SS, or bare seconds (pbs_resources(7B), "duration")."""
    parts = str(value).split(":") if value is not None else []
    if not parts or len(parts) > 3 or not all(p.isdigit() for p in parts):
        return None
    total = 0
    for part in parts:
        total = total * 60 + int(part)
    return total


def _exit_code(status: int | None) -> int | None:
    """The exit status as a shell reports it: 128 + N for a job killed by signal N."""
    if status is None or status < 0:
        return None
    return 128 + status - 256 if status >= 256 else status


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None
