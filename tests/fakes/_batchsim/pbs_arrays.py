"""Job arrays of PBS Professional: `qsub -J X-Y[:Z]`, shown by qstat and deleted by qdel.

PBS Professional 2022 User's Guide, "Job Arrays", and Reference Guide, qsub(1B) -J, qstat(1B)
-t/-J, qdel(1B); OpenPBS sources, which the following follows:
  - src/lib/Libcmds/chk_Jrange.c: X-Y[:Z] with X >= 0, X < Y, Z >= 1.
  - src/server/array_func.c get_subjob_and_state: a subjob is queued while its index is in
    the array's queued list, has a job of its own while it runs (and, with job history, once
    it has finished: state X, its own Exit_status, substate 91/92/93), and otherwise shows
    as X ("expired", F once the array is finished) with the parent's attributes.
  - src/server/stat_job.c status_subjob: such a subjob is the parent's record with the
    subjob's state, the comment "Subjob finished", and none of the parent's attributes from
    `array` on (array_id and array_index only show on a subjob's own job).
  - src/lib/Libifl/dec_rpyc.c expand_remaining_subjob: with -t, qstat lists queued subjobs
    from the parent's array_indices_remaining, as the parent's record in state Q, substate 10.
  - src/server/array_func.c update_sj_parent: the parent's Exit_status is set from each
    subjob that ends with one: 0, 1 (positive), 2 (negative); chk_array_doneness: the array
    finishes (F) once no subjob is queued, running or exiting, and leaves the server then
    unless job_history_enable is set.
  - src/server/req_delete.c: `qdel N[i]` deletes one subjob (a queued one just expires),
    a finished one is refused with PBSE_NOHISTARRAYSUBJOB "Request invalid for finished
    array subjob" (15159 & 0xff = 55); `qdel N[]` deletes every subjob.
The array's own record is never stored: it is built from its subjobs, each a job record of
its own (state.array_element) that the scheduler and the supervisor run as any job.
"""

from __future__ import annotations

import re

from . import pbs_attributes
from .common import CommandError
from .flavors import pbs_exit_status
from .state import DONE, QUEUED, RUNNING

_RANGE = re.compile(r"(\d+)-(\d+)(?::(\d+))?")
_ID = re.compile(r"(\d+)(?:\[(\d*)\])?")
NOHISTARRAYSUBJOB = ("Request invalid for finished array subjob", 55)
MAX_ARRAY_SIZE = ("qsub: Array job exceeds server or queue size limit", 3)  # PBSE_MaxArraySize


def parse_range(text: str, usage: str) -> list[int]:
    """The indices of `-J X-Y[:Z]` (chk_Jrange)."""
    match = _RANGE.fullmatch(text)
    start, end = (int(match[1]), int(match[2])) if match else (0, 0)
    step = int(match[3]) if match and match[3] else 1
    if not match or start >= end or step < 1:
        raise CommandError(f"qsub: illegal -J value\n{usage}", 2)
    return list(range(start, end + 1, step))


def split_id(head: str) -> tuple[int, str | None] | None:
    """`1000` -> (1000, None); `1000[]` -> (1000, ""); `1000[3]` -> (1000, "3")."""
    match = _ID.fullmatch(head)
    if not match:
        return None
    return int(match[1]), (match[2] if "[" in head else None)


def arrays(jobs: dict) -> dict[int, list[dict]]:
    """Each array's subjobs, by the array's number, in index order."""
    found: dict[int, list[dict]] = {}
    for job in sorted(jobs.values(), key=lambda j: j["id"]):
        if job.get("array"):
            found.setdefault(job["array"]["id"], []).append(job)
    return found


def finished(subjobs: list[dict]) -> bool:
    return all(j["state"] == DONE for j in subjobs)


def parent_state(subjobs: list[dict]) -> str:
    """Q until a subjob has started, B while any is queued or running, F once all ended."""
    if finished(subjobs):
        return "F"
    started = any(j.get("run_count") for j in subjobs)  # req_runjob.c: the array is BEGUN
    return "B" if started else "Q"


def subjob_state(job: dict, subjobs: list[dict], history: bool) -> str:
    """Q, R; once ended X, and F where it shows through its finished array."""
    if job["state"] == QUEUED:
        return "Q"
    if job["state"] == RUNNING:
        return "R"
    return "F" if finished(subjobs) and not own_record(job, history) else "X"


def own_record(job: dict, history: bool) -> bool:
    """Whether the subjob has a job of its own (else it shows through its parent): while it
    runs, once it has run where the server keeps job history, and queued again after a run
    (qrerun: force_reque leaves the subjob's job in state Q, get_subjob_and_state finds it)."""
    requeued = job["state"] == QUEUED and bool(job.get("run_count"))
    ended = history and job["state"] == DONE and bool(job["pid"])
    return job["state"] == RUNNING or requeued or ended


def _range_text(indices: list[int]) -> str:
    """PBS's range form: `0-3,7,9-10`; `-` for none."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and runs[-1][1] == index - 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "-"


def parent_attributes(first: dict, subjobs: list[dict], exit_status: int | None) -> dict:
    """The array's own attributes, after those its subjobs share (pbs_job_attributes(7B):
    array, array_indices_submitted, array_indices_remaining, array_state_count)."""
    counts = {"Queued": 0, "Running": 0, "Exiting": 0, "Expired": 0}
    for job in subjobs:
        counts[{QUEUED: "Queued", RUNNING: "Running"}.get(job["state"], "Expired")] += 1
    attrs: dict = {
        "array": "True",
        "array_indices_submitted": first["native"]["array_indices"],
        "array_indices_remaining": _range_text(
            [j["array"]["index"] for j in subjobs if j["state"] == QUEUED]
        ),
        "array_state_count": "".join(f"{k}:{v} " for k, v in counts.items()),
    }
    if exit_status is not None:
        attrs["Exit_status"] = exit_status
    return attrs


def parent_exit_status(subjobs: list[dict]) -> int | None:
    """update_sj_parent: the last subjob to end with an exit status sets the parent's."""
    ended = [
        (j["end_time"], status)
        for j in subjobs
        if j["state"] == DONE and (status := pbs_exit_status(j)) is not None
    ]
    if not ended:
        return None
    status = max(ended, key=lambda pair: pair[0])[1]
    return 1 if status > 0 else 2 if status < 0 else 0


def parent_record(subjobs: list[dict], cfg: dict, now: float, variables: dict) -> dict:
    """The array job's attributes (qstat -f of N[]): the subjobs' shared ones, its state (Q,
    B, F; substate 10, 41 JOB_SUBSTATE_BEGUN, 92), and the array's own."""
    first, done = subjobs[0], finished(subjobs)
    started = [j["start_time"] for j in subjobs if j["start_time"]]
    view = {
        **first,
        "state": DONE if done else QUEUED,
        "held": False,
        "pending": None,
        "launch_time": None,
        "start_time": min(started) if started else None,
        "run_count": 0,  # never sent to run itself: its subjobs are (req_runjob.c)
        "end_time": max(j["end_time"] for j in subjobs) if done else None,
        "pid": None,
        "kill": None,
        "lost": None,
    }
    attrs = pbs_attributes.pbspro(view, cfg, now, variables)
    for name in ("exec_host", "exec_vnode", "comment", "Exit_status"):
        attrs.pop(name, None)
    letter = parent_state(subjobs)
    attrs.update(job_state=letter, substate={"Q": 10, "B": 41, "F": 92}[letter])
    attrs.update(parent_attributes(first, subjobs, parent_exit_status(subjobs)))
    return attrs


def subjob_record(job: dict, subjobs: list[dict], cfg: dict, now: float, variables: dict) -> dict:
    """A subjob's attributes: its own job's, with array_id and array_index, where it has one
    (own_record); else its parent's up to `array`, in the subjob's state (Q with substate 10;
    X with the comment "Subjob finished", "Subjob failed" or "Subjob terminated")."""
    index = job["array"]["index"]
    if own_record(job, cfg["job_history_enable"]):
        attrs = pbs_attributes.pbspro(job, cfg, now, variables)
        if job["state"] == DONE:
            attrs["job_state"] = "X"  # svr_jobfunc.c: a finished subjob's history state
        attrs.update(array_id=f"{job['array']['id']}[].{cfg['server']}", array_index=index)
        return attrs
    attrs = parent_record(subjobs, cfg, now, variables)
    for name in list(attrs)[list(attrs).index("array") :]:
        if name != "Exit_status":  # before `array` in the server's attribute order
            attrs.pop(name)
    letter = subjob_state(job, subjobs, cfg["job_history_enable"])
    attrs["job_state"] = letter
    if letter == "Q":
        attrs["substate"] = 10
    else:
        attrs["comment"] = subjob_comment(job)
    return attrs


def subjob_comment(job: dict) -> str:
    """The comment a finished subjob shows through its array (OpenPBS array_func.c): deleted,
    a non-zero exit (or a signal), or finished."""
    if job["kill"] == "cancel":
        return "Subjob terminated"
    return "Subjob finished" if pbs_exit_status(job) in (0, None) else "Subjob failed"
