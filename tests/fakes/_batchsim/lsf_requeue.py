"""brequeue of IBM Spectrum LSF: a job or an array's element killed and queued again.

IBM Spectrum LSF 10.1 Command Reference, brequeue: `brequeue [-a] [-d] [-e] [-H] [-r] [-J
job_name] [-u user_name | -u all] [job_ID | "job_ID[index]" ...]`; only the job's owner, root
or an LSF administrator may requeue it; a running job is killed and returned to the queue,
PEND (PSUSP with -H), keeping its id; by default the most recently submitted job. The open
source lineage, which the following follows for what the manual leaves unsaid:
  - volclava lsbatch/cmd/brequeue.c: -r (running jobs) unless -d (DONE), -e (EXIT) or -a (all
    three) is given; "Job <id> is being requeued " on stdout for each job; each refusal through
    lsb_perror("Job <id> "), "Job <id> : <message>" on stderr, and exit 255.
  - volclava lsbatch/daemons/mbd.job.c arrayRequeue: a running job is killed (SIG_KILL_REQUEUE,
    which sbd.sig.c sends as bkill's SIG_TERM_USER), a DONE or EXIT one asked for is queued at
    once; otherwise "Job has not started yet" (pending), "Job has already finished" (-r),
    "Job has already started" (-d or -e of a running job), "Bad or invalid action
    specification" (-d of an EXIT job, -e of a DONE one); an array's number names every element,
    and the request succeeds if one element is requeued (lsbatch/lib/lsb.err.c for the words).
bjobs shows no count of requeues or runs (bjobs -o has no such field): a requeued element is
PEND again, with nothing to tell it from one that has not run.
"""

from __future__ import annotations

import os
import sys
import time

from .common import CommandError, fail, short_options
from .lsf_fields import stat
from .lsf_status import named_jobs
from .state import Sim, ask_requeue, shown_id

USAGE = (
    "Usage: brequeue [-deraH] [-h] [-V] [-u user_name | -u all]\n"
    '                [-J name_spec] [jobId | "jobId[idxList]" ...]\n'
)
NOT_STARTED = "Job has not started yet"  # LSBE_NOT_STARTED
STARTED = "Job has already started"  # LSBE_JOB_STARTED
FINISHED = "Job has already finished"  # LSBE_JOB_FINISH
BAD_ACTION = "Bad or invalid action specification"  # LSBE_EXCEPT_ACTION


def brequeue_main(flavor: str, argv: list[str]) -> int:
    try:
        opts, operands = short_options(argv, "deraHVhu:J:")
    except CommandError:
        return fail(CommandError(USAGE, 255))
    flags = dict(opts)
    if "-h" in flags:
        return fail(CommandError(USAGE, 255))
    wanted = _wanted_states(flags)
    status = 0
    with Sim(flavor).writing() as data:
        targets = operands or _chosen(data["jobs"], flags)
        if not targets:
            return fail(CommandError("No matching job found", 255))
        for target in targets:
            error = _requeue(data["jobs"], target, wanted, "-H" in flags)
            if error:
                sys.stderr.write(f"Job <{target}> : {error}\n")
                status = 255
            else:
                sys.stdout.write(f"Job <{target}> is being requeued \n")
    return status


def _wanted_states(flags: dict) -> set[str]:
    """The states whose jobs are requeued: RUN by default (-r), DONE (-d), EXIT (-e), all (-a)."""
    if "-a" in flags:
        return {"RUN", "DONE", "EXIT"}
    chosen = {
        state for flag, state in (("-r", "RUN"), ("-d", "DONE"), ("-e", "EXIT")) if flag in flags
    }
    return chosen or {"RUN"}


def _chosen(jobs: dict, flags: dict) -> list[str]:
    """Without ids: the jobs named by -J (an array's elements by the array's name), of -u's
    user (or every user's with `all`), else the invoking user's most recently submitted job."""
    import pwd

    try:
        me = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        me = str(os.getuid())
    user = flags.get("-u", me)
    mine = sorted(
        (j for j in jobs.values() if user == "all" or j["owner"] == user), key=lambda j: j["id"]
    )
    if "-J" in flags:
        named = [j for j in mine if flags["-J"] in (j["name"], j["name"].split("[")[0])]
        return [shown_id(j) for j in named]
    return [shown_id(mine[-1])] if mine else []


def _requeue(jobs: dict, target: str, wanted: set[str], held: bool) -> str | None:
    """Requeue the job (every element of an array's number) as arrayRequeue does: None, or the
    refusal's words."""
    found = named_jobs(jobs, target)
    if not found:
        return "No matching job found"
    if os.getuid() not in (0, found[0]["uid"]):
        return "User permission denied"
    now, error, requeued = time.time(), None, False
    for job in found:
        state = stat(job)
        if state not in wanted:
            error = _refusal(state, wanted)
            continue
        if not job.get("requeue"):  # a run being killed for a requeue already is left so
            ask_requeue(job, now, held)  # RUN: killed first; DONE or EXIT: queued at once
        requeued = True
    return None if requeued else error


def _refusal(state: str, wanted: set[str]) -> str:
    """arrayRequeue's reply for a job not in a state asked for (the last asked state's check
    decides, -r before -d before -e)."""
    reply = BAD_ACTION
    for asked in ("RUN", "DONE", "EXIT"):
        if asked not in wanted:
            continue
        if state in ("PEND", "PSUSP"):
            reply = NOT_STARTED
        elif state == "RUN":
            reply = STARTED
        elif asked == "RUN":
            reply = FINISHED
        else:
            reply = BAD_ACTION
    return reply
