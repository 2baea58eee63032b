"""bjobs and bkill of IBM Spectrum LSF.

IBM Spectrum LSF 10.1 Command Reference: bjobs (-a -d -p -r -s -u user|all -q -J -o
-json -noheader -w; default columns JOBID USER STAT QUEUE FROM_HOST EXEC_HOST JOB_NAME
SUBMIT_TIME; "No unfinished job found"; "Job <id> is not found") and bkill ("Job <id>
is being terminated"; "Job <id>: No matching job found"; "Job <id>: Job has already
finished"; bkill 0 for all of one's jobs). Exit statuses follow the open-source LSF
lineage (volclava lsbatch/cmd/bjobs.c): 255 when a requested job is not found or
nothing is displayed; with -json, 0 as soon as one record is displayed and the
missing ones appear as {"JOBID": "<id>", "ERROR": "Job <id> is not found"}.
Nothing to show without ids exits 0, or 255 where LSB_BJOBS_CONSISTENT_EXIT_CODE=Y
(IBM Spectrum LSF 10.1 Configuration Reference, lsf.conf; default N).
Job arrays ("Job arrays", bjobs and bkill synopses "job_ID | "job_ID[index]""): an array's
number names all its elements, "number[index]" one of them.
"""

from __future__ import annotations

import json
import os
import sys
import time

from .common import CommandError, fail, short_options
from .lsf_fields import DEFAULT_FIELDS, FIELDS, stat
from .state import DONE, QUEUED, RUNNING, Sim, finish, shown_id
from .supervisor import ensure_supervisor

USAGE = (
    'Usage: bjobs [-h] [-V] [-w | -l] [-a] [-d] [-p] [-s] [-r] [-o "field ..." '
    "[-json]] [-noheader]\n             [-q queue_name] [-u user_name | -u all] "
    "[-J name_spec] [jobId ...]\n"
)
ORDER = {"RUN": 0, "PSUSP": 1, "PEND": 2, "DONE": 3, "EXIT": 3}
EMPTY = {
    "": "No unfinished job found",
    "-a": "No job found",
    "-d": "No done job found",
    "-p": "No pending job found",
    "-r": "No running job found",
    "-s": "No suspended job found",
}


def _fields(spec: str | None) -> tuple[list[str], str]:
    if spec is None:
        return DEFAULT_FIELDS, " "
    names, delimiter = [], " "
    for token in spec.split():
        if token.startswith("delimiter="):
            delimiter = token.split("=", 1)[1].strip("'\"") or " "
            continue
        name = token.split(":")[0].lower()
        if name not in FIELDS:
            raise CommandError(f"<{token}> in the format string is not a valid field name.", 255)
        if name not in names:
            names.append(name)
    return names, delimiter


def _wanted(job: dict, flags: dict, me: str) -> bool:
    user = flags.get("-u", me)
    if user != "all" and job["owner"] != user:
        return False
    if "-q" in flags and job["queue"] != flags["-q"]:
        return False
    # -J: a job's name, or an array's (each of its elements is "name[index]").
    if "-J" in flags and flags["-J"] not in (job["name"], job["name"].split("[")[0]):
        return False
    state = stat(job)
    if "-a" in flags:
        return True
    if "-d" in flags:
        return state in ("DONE", "EXIT")
    if "-p" in flags:
        return state in ("PEND", "PSUSP")
    if "-r" in flags:
        return state == "RUN"
    if "-s" in flags:
        return state == "PSUSP"
    return job["state"] != DONE


def hidden(job: dict, cfg: dict) -> bool:
    """lsb.params SECURE_JOB_INFO_LEVEL 1 to 5 (IBM Spectrum LSF 10.1 Configuration
    Reference): a user sees the details of only their own jobs; another user's job is not
    shown (the simulator keeps level 1's rule at every level: the others show no details
    that a status query could use). Root, as an LSF administrator, sees every job."""
    uid = os.getuid()
    return bool(cfg.get("secure_job_info_level")) and uid != 0 and job["uid"] != uid


def bparams_main(flavor: str, argv: list[str]) -> int:
    """`bparams -a`: every lsb.params parameter as `NAME = value` (IBM Spectrum LSF 10.1
    Command Reference, bparams -a); the simulator shows those it follows."""
    if argv != ["-a"]:
        return fail(CommandError("Usage: bparams [-h] [-V] [-l | -a]", 255))
    with Sim(flavor).reading() as data:
        cfg = data["config"]
    sys.stdout.write(
        "System default queues for automatic queue selection:\n"
        f"    {cfg['queues'][0]}\n\n"
        f"    MAX_JOB_ARRAY_SIZE = {cfg['max_job_array_size']}\n"
        f"    SECURE_JOB_INFO_LEVEL = {cfg.get('secure_job_info_level') or 0}\n"
    )
    return 0


def bjobs_main(flavor: str, argv: list[str]) -> int:
    as_json = "-json" in argv
    noheader = "-noheader" in argv
    argv = [a for a in argv if a not in ("-json", "-noheader")]
    try:
        opts, operands = short_options(argv, "adprswlWAu:q:J:o:P:m:")
        flags = dict(opts)
        names, delimiter = _fields(flags.get("-o"))
    except CommandError as error:
        text = error.message if error.status == 255 else f"bjobs: {error.message}\n{USAGE}"
        return fail(CommandError(text, 255))
    me = _user_name()
    sim = Sim("lsf")
    now = time.time()
    with sim.reading() as data:
        cfg, jobs = data["config"], data["jobs"]
        if any(j["uid"] == os.getuid() and j["state"] in (QUEUED, RUNNING) for j in jobs.values()):
            ensure_supervisor(sim)
    shown, missing = [], []
    if operands:
        for operand in operands:
            found = [j for j in named_jobs(jobs, operand) if not hidden(j, cfg)]
            (shown.extend(found) if found else missing.append(operand))
    else:
        shown = sorted(
            (j for j in jobs.values() if _wanted(j, flags, me) and not hidden(j, cfg)),
            key=lambda j: (ORDER[stat(j)], j["id"]),
        )
    rows = [{n.upper(): FIELDS[n](job, cfg, now) for n in names} for job in shown]
    if as_json:
        records = rows + [{"JOBID": m, "ERROR": f"Job <{m}> is not found"} for m in missing]
        report = {"COMMAND": "bjobs", "JOBS": len(records), "RECORDS": records}
        text = json.dumps(report, indent=2, separators=(",", ":")).replace("/", "\\/")
        sys.stdout.write(text + "\n")
    else:
        for name in missing:
            sys.stderr.write(f"Job <{name}> is not found\n")
        sys.stdout.write(_text(rows, names, delimiter, noheader, "-o" in flags))
    if not shown and not operands:
        key = next((k for k in ("-a", "-d", "-p", "-r", "-s") if k in flags), "")
        if not as_json:
            sys.stderr.write(EMPTY[key] + "\n")
        return 255 if cfg["bjobs_consistent_exit_code"] else 0
    if not shown or (missing and not as_json):
        return 255
    return 0


def named_jobs(jobs: dict, operand: str) -> list[dict]:
    """The jobs an id names: a job, every element of an array ("3000"), or one element
    ("3000[3]")."""
    number, _, index = operand.partition("[")
    if not number.isdigit():
        return []
    if index:
        return [j for j in jobs.values() if shown_id(j) == operand]
    elements = [j for j in jobs.values() if j.get("array") and j["array"]["id"] == int(number)]
    job = jobs.get(number)
    return sorted(elements, key=lambda j: j["id"]) or (
        [] if job is None or job.get("array") else [job]
    )


def _user_name() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _text(rows: list[dict], names: list[str], delimiter: str, noheader: bool, custom: bool) -> str:
    if not rows:
        return ""
    if custom:
        lines = [] if noheader else [delimiter.join(n.upper() for n in names)]
        lines += [delimiter.join(r[n.upper()] or "-" for n in names) for r in rows]
        return "\n".join(lines) + "\n"
    lines = (
        []
        if noheader
        else ["JOBID   USER    STAT  QUEUE      FROM_HOST   EXEC_HOST   JOB_NAME   SUBMIT_TIME"]
    )
    for r in rows:
        name = r["JOB_NAME"] if len(r["JOB_NAME"]) <= 10 else "*" + r["JOB_NAME"][-9:]
        lines.append(
            f"{r['JOBID']:<7} {r['USER'][:7]:<7} {r['STAT']:<5} {r['QUEUE'][:10]:<10} "
            f"{r['FROM_HOST'][:11]:<11} {r['EXEC_HOST'][:11]:<11} {name:<10} "
            f"{r['SUBMIT_TIME']}"
        )
    return "\n".join(lines) + "\n"


def bkill_main(flavor: str, argv: list[str]) -> int:
    try:
        opts, operands = short_options(argv, "C:s:u:q:J:lb")
    except CommandError as error:
        return fail(CommandError(f"bkill: {error.message}", 255))
    flags = dict(opts)
    if not operands:
        return fail(
            CommandError(
                "Usage: bkill [-h] [-V] [-l] [-b] [-C kill_reason] "
                "[-q queue_name] [-u user_name | -u all] "
                "[-J job_name] [jobId ...] [0]",
                255,
            ),
        )
    status = 0
    sim = Sim("lsf")
    with sim.writing() as data:
        now, uid = time.time(), os.getuid()
        targets = operands
        if operands == ["0"]:
            targets = [
                shown_id(j)
                for j in sorted(data["jobs"].values(), key=lambda j: j["id"])
                if j["uid"] == uid and j["state"] != DONE
            ]
            if not targets:
                return fail(CommandError("No unfinished job found", 255))
        for target in targets:
            found = named_jobs(data["jobs"], target)
            live = [j for j in found if j["state"] != DONE]
            if not found:
                sys.stderr.write(f"Job <{target}>: No matching job found\n")
                status = 255
            elif uid not in (0, found[0]["uid"]):
                sys.stderr.write(f"Job <{target}>: User permission denied\n")
                status = 255
            elif not live:
                sys.stderr.write(f"Job <{target}>: Job has already finished\n")
                status = 255
            else:
                for job in live:  # an array's number: each of its unfinished elements
                    job["cancel"] = {"time": now, "by": uid}
                    job["kill_reason"] = flags.get("-C", "")
                    if job["state"] == QUEUED:
                        job["kill"] = "cancel"
                        finish(job, now, None)
                sys.stdout.write(f"Job <{target}> is being terminated\n")
    return status
