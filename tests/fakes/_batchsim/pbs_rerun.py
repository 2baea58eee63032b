"""qrerun of PBS Professional: a running job, subjob or array job killed and queued again.

PBS Professional 2022 Reference Guide, qrerun(1B) (`qrerun [-W force] job_identifier...`;
only a PBS Manager, Operator or root may rerun a job) and pbs_job_attributes(7B) run_count.
OpenPBS sources, which the following follows:
  - src/cmds/qrerun.c: usage, exit status the last error's PBSE_* number & 0xff, each error
    printed by prt_job_err as "qrerun: <message> <id>" (PBSE_HISTJOBID's message without the
    id: "Job has finished").
  - src/server/svr_chk_owner.c chk_job_request: an unknown job (PBSE_UNKJOBID, 153), a finished
    one kept in history (PBSE_HISTJOBID, 35), another user's (PBSE_PERM, 159); then
    src/server/req_rerun.c req_rerunjob refuses anyone without manager or operator rights
    (PBSE_PERM, the owner too).
  - req_rerunjob: a subjob `N[i]` is rerun only while it runs (PBSE_BADSTATE 168 otherwise, an
    index outside the array PBSE_IVALREQ 156); an array job `N[]` only once begun: each running
    subjob is rerun, each ended one queued again.
  - req_rerunjob2: the job must be rerunnable (`qsub -r n`: PBSE_NORERUN "job is not
    rerunnable", 190, unless -W force) and running (PBSE_BADSTATE); the MoM kills it as for
    qdel (src/resmom/requests.c SIG_RERUN: terminate_job, SIGTERM then SIGKILL after
    kill_delay) with substate 60 (JOB_SUBSTATE_RERUN) meanwhile, and the request is answered
    once the job is queued again, or after job_requeue_timeout (45 s, PBS_DIS_TCP_TIMEOUT_RERUN)
    with "Response timed out. Job rerun request still in progress for" (PBSE_INTERNAL, 163).
  - src/server/req_runjob.c svr_strtjob2: run_count grows each time the job is sent to run.
"""

from __future__ import annotations

import os
import sys
import time

from . import pbs_arrays
from .common import CommandError, fail, short_options
from .pbs_status import array_forgotten, forgotten, operand_id, parse_operand
from .state import DONE, RUNNING, Sim, ask_requeue

USAGE = "usage: qrerun [-W force] job_identifier...\n       qrerun --version\n"
REPLY_TIMEOUT = 45.0  # job_requeue_timeout's default (PBS_DIS_TCP_TIMEOUT_RERUN)
WAIT_SECONDS = 0.05
UNKNOWN = ("Unknown Job Id", 153)  # PBSE_UNKJOBID
PERM = ("Unauthorized Request ", 159)  # PBSE_PERM
BADSTATE = ("Request invalid for state of job", 168)  # PBSE_BADSTATE
NORERUN = ("job is not rerunnable", 190)  # PBSE_NORERUN
IVALREQ = ("Invalid request", 156)  # PBSE_IVALREQ
TIMED_OUT = ("Response timed out. Job rerun request still in progress for", 163)


def qrerun_main(flavor: str, argv: list[str]) -> int:
    if argv == ["--version"]:
        with Sim(flavor).reading() as data:
            sys.stdout.write(f"pbs_version = {data['config']['pbs_version']}\n")
        return 0
    try:
        opts, operands = short_options(argv, "W:")
    except CommandError:
        return fail(CommandError(USAGE, 2))
    if not operands or any(value != "force" for _, value in opts):
        return fail(CommandError(USAGE, 2))
    force = bool(opts)
    status = 0
    waiting: dict[str, list[int]] = {}
    sim = Sim(flavor)
    with sim.writing() as data:
        for operand in operands:
            error, rerun = _rerun(data, operand, force)
            if error:
                sys.stderr.write(f"qrerun: {error[0]}\n")
                status = error[1]
            elif rerun:
                waiting[operand_id(operand, data["config"])] = rerun
    for shown in _still_running(sim, waiting):
        sys.stderr.write(f"qrerun: {TIMED_OUT[0]} {shown}\n")
        status = TIMED_OUT[1]
    return status


def _rerun(data: dict, operand: str, force: bool) -> tuple[tuple[str, int] | None, list[int]]:
    """The refusal (its words and status) or the jobs whose runs are being killed."""
    cfg = data["config"]
    parsed = parse_operand(operand, cfg)
    shown = operand_id(operand, cfg)
    if parsed is None:
        if not operand[:1].isdigit():
            return (f"illegally formed job identifier: {operand}", 1), []
        return (f"{UNKNOWN[0]} {shown}", UNKNOWN[1]), []
    number, index = parsed
    subjobs = pbs_arrays.arrays(data["jobs"]).get(number, [])
    job = data["jobs"].get(str(number))
    if index is None and (job is None or job.get("array") or forgotten("pbspro", job, cfg)):
        return (f"{UNKNOWN[0]} {shown}", UNKNOWN[1]), []
    if index is not None and (not subjobs or array_forgotten(subjobs, cfg)):
        return (f"{UNKNOWN[0]} {shown}", UNKNOWN[1]), []
    jobs = [job] if index is None and job is not None else subjobs
    if all(j["state"] == DONE for j in jobs):
        return ("Job has finished", 35), []  # PBSE_HISTJOBID, its message without the id
    if os.getuid() != 0:  # the owner may not either: a manager's or an operator's request
        return (f"{PERM[0]} {shown}", PERM[1]), []
    if index == "":
        return _rerun_array(subjobs, shown, force)
    if index is not None:
        match = [j for j in subjobs if str(j["array"]["index"]) == index]
        if not match:
            return (f"{IVALREQ[0]} {shown}", IVALREQ[1]), []
        if match[0]["state"] != RUNNING:  # req_rerunjob: a subjob that does not run
            return (f"{BADSTATE[0]} {shown}", BADSTATE[1]), []
        jobs = match
    return _rerun_one(jobs[0], shown, force)


def _rerun_one(job: dict, shown: str, force: bool) -> tuple[tuple[str, int] | None, list[int]]:
    """req_rerunjob2: a running, rerunnable job's run is killed; it is queued again after."""
    if not job["native"]["rerunable"] and not force:
        return (f"{NORERUN[0]} {shown}", NORERUN[1]), []
    if job["state"] != RUNNING or job["kill"] or job.get("requeue"):
        return (f"{BADSTATE[0]} {shown}", BADSTATE[1]), []
    ask_requeue(job, time.time())
    return None, [job["id"]]


def _rerun_array(
    subjobs: list[dict], shown: str, force: bool
) -> tuple[tuple[str, int] | None, list[int]]:
    """An array job once begun: every running subjob rerun, every ended one queued again."""
    if pbs_arrays.parent_state(subjobs) != "B":
        return (f"{BADSTATE[0]} {shown}", BADSTATE[1]), []
    if not subjobs[0]["native"]["rerunable"] and not force:
        return (f"{NORERUN[0]} {shown}", NORERUN[1]), []
    now, killed = time.time(), []
    for job in subjobs:
        if job["state"] == RUNNING and not (job["kill"] or job.get("requeue")):
            ask_requeue(job, now)
            killed.append(job["id"])
        elif job["state"] == DONE:
            ask_requeue(job, now)
    return None, killed


def _still_running(sim: Sim, waiting: dict[str, list[int]]) -> list[str]:
    """The server answers once each job is queued again: the ids (as shown) whose jobs still
    run their killed runs after the reply timeout."""
    deadline = time.monotonic() + REPLY_TIMEOUT
    pending = dict(waiting)
    while pending and time.monotonic() < deadline:
        with sim.reading() as data:
            jobs = data["jobs"]
            pending = {
                shown: seqs
                for shown, seqs in pending.items()
                if any(jobs.get(str(seq), {}).get("requeue") for seq in seqs)
            }
        if pending:
            time.sleep(WAIT_SECONDS)
    return list(pending)
