"""Job arrays of Torque: `qsub -t`, shown by qstat (a summary, or with -t each subjob) and
deleted by qdel.

TORQUE 6.1 Administrator Guide, "Job arrays" (qsub -t: a comma-separated list of indices and
X-Y ranges; qsub prints `123[].server`; each subjob `123[4].server` has PBS_ARRAYID; qstat shows
one summary per array, qstat -t each subjob), "Server parameters" max_job_array_size; TORQUE
6.1 sources, which the following follows:
  - src/server/job_array.cpp parse_array_request: the request's indices; more of them than
    the server's max_job_array_size (where set) is ARRAY_TOO_LARGE, which req_quejob.c
    refuses as PBSE_BAD_ARRAY_REQ "Requested array size too large, limit is N".
  - src/server/job_func.c job_clone: each subjob is a job of its own, its Job_Name,
    Output_Path and Error_Path the array's with "-<index>" appended, job_array_id its index,
    PBS_ARRAYID=<index> in its Variable_List; job_array_request stays on the array's template.
  - src/cmds/qstat.c: without -t the server is asked to summarize arrays (one record per
    array, `123[]`); src/server/req_stat.c: with -t, an array's id lists its subjobs (tjstArray),
    and an array no longer on the server is refused with PBSE_UNKARRAYID, "Unknown Array ID
    MSG=unable to find array"; src/server/array_func.c update_array_statuses: the summary is
    R while a subjob runs, C once every subjob has completed, Q otherwise.
  - src/server/req_deletearray.c: `qdel 123[]` deletes every subjob that has not completed and
    is acknowledged even for an array the server no longer has; `qdel 123[4]` is a job's qdel.
The array's template is not stored: its summary is built from the subjobs, each a job record
(state.array_element) that the scheduler and the supervisor run as any job; an array is on
the server while any of its subjobs is (completed ones stay for keep_completed).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from . import pbs_attributes
from .common import CommandError
from .state import DONE, QUEUED, RUNNING

_PART = re.compile(r"(\d+)(?:-(\d+))?")
# PBSE_BAD_ARRAY_REQ 15083 and PBSE_UNKARRAYID 15082 in TORQUE's numbering (pbs_error_db.h),
# & 0xff as the commands exit with them.
BAD_ARRAY_REQ = ("qsub: submit error (Bad Job Array Request)", 15083 & 0xFF)
UNKNOWN_ARRAY = ("Unknown Array ID MSG=unable to find array", 15082 & 0xFF)
# Attributes only a job that ran has, which the summary does not show.
_RUN_ONLY = (
    "resources_used.",
    "exec_host",
    "exec_port",
    "session_id",
    "exit_status",
    "start_time",
    "start_count",
    "comp_time",
    "total_runtime",
)


def parse_request(text: str) -> list[int]:
    """The indices of `-t` (comma-separated indices and X-Y ranges, X <= Y). A slot limit
    (`%N`) is not simulated and is refused."""
    indices: list[int] = []
    for part in text.split(","):
        match = _PART.fullmatch(part.strip())
        if not match or (match[2] and int(match[2]) < int(match[1])):
            raise CommandError(*BAD_ARRAY_REQ)
        end = int(match[2]) if match[2] else int(match[1])
        indices += range(int(match[1]), end + 1)
    return sorted(set(indices))


def check_size(indices: list[int], cfg: dict) -> None:
    """max_job_array_size, where the server sets it (unset: no limit)."""
    limit = cfg.get("max_job_array_size")
    if limit is not None and len(indices) > limit:
        message, status = BAD_ARRAY_REQ
        raise CommandError(
            f"{message[:-1]} MSG=Requested array size too large, limit is {limit})", status
        )


def subjob_fields(element: dict, index: int) -> None:
    """job_clone: the subjob's name and output paths are the array's with "-<index>"."""
    for field in ("name", "stdout", "stderr"):
        element[field] = f"{element[field]}-{index}"


def summary_state(subjobs: list[dict]) -> str:
    """update_array_statuses: R while any runs, C once all completed, Q otherwise."""
    if any(j["state"] == RUNNING for j in subjobs):
        return "R"
    if all(j["state"] == DONE for j in subjobs):
        return "C"
    return "Q"


def _base(value: str, index: int) -> str:
    return value.removesuffix(f"-{index}")


def summary_pairs(subjobs: list[dict], cfg: dict, now: float, variables: dict) -> list:
    """The array's summary record (qstat -f without -t): its first subjob's attributes as the
    template's (its name and paths without the index, no run), its state and
    job_array_request."""
    first = subjobs[0]
    index = first["array"]["index"]
    pairs = []
    for name, value in pbs_attributes.torque(first, cfg, now, variables):
        if name.startswith(_RUN_ONLY) or name == "job_array_id":
            continue
        if name in ("Job_Name", "Output_Path", "Error_Path"):
            value = _base(str(value), index)
        elif name == "job_state":
            value = summary_state(subjobs)
        elif name == "Variable_List":
            value = ",".join(v for v in str(value).split(",") if not v.startswith("PBS_ARRAYID="))
        pairs.append((name, value))
    pairs.append(("job_array_request", first["native"]["array_indices"]))
    return pairs


def summary_row(subjobs: list[dict]) -> dict:
    """The summary as the one-line format reads it."""
    first = subjobs[0]
    name = _base(first["name"], first["array"]["index"])
    shown = f"{first['array']['id']}[]"
    return {**first, "name": name, "shown": shown, "letter": summary_state(subjobs)}


def delete_array(subjobs: list[dict], cancel: Callable[[dict], None]) -> None:
    """`qdel 123[]`: every subjob that has not completed."""
    for job in subjobs:
        if job["state"] in (QUEUED, RUNNING):
            cancel(job)
