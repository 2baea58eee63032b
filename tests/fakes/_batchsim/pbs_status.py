"""qstat and qdel of PBS Professional and Torque.

PBS Professional Reference Guide: qstat(1B) (default format, -f long format, -F json,
-x history, -w), qdel(1B) (-x, -W force); OpenPBS src/cmds/qstat.c and qdel.c for the
messages and exit statuses: "qstat: Unknown Job Id <id>" exits 153 (PBSE_UNKJOBID
15001 & 0xff), "qstat: <id> Job has finished, use -x or -H to obtain historical job
information" exits 35 (PBSE_HISTJOBID 15139 & 0xff), "qdel: Job has finished <id>"
exits 35, "qdel: Unauthorized Request  <id>" exits 159 (PBSE_PERM).
TORQUE 6.1 qstat/qdel: "qstat: Unknown Job Id Error <id>" (153), completed jobs stay
in state C for keep_completed, "qdel: Request invalid for state of job MSG=invalid
state for job - COMPLETE <id>" (170, PBSE_BADSTATE 15018 in Torque's numbering).
"""

from __future__ import annotations

import json
import os
import sys
import time

from . import pbs_attributes
from .common import CommandError, fail, short_options
from .state import DONE, QUEUED, RUNNING, Sim, finish
from .supervisor import ensure_supervisor

QSTAT_OPTIONS = {"pbspro": "fF:xwu:1", "torque": "f1u:"}
QSTAT_USAGE = {
    "pbspro": "usage: \nqstat [-f] [-J] [-p] [-t] [-x] [-E] "
    "[ job_identifier... | destination... ]\n"
    "qstat [-a|-i|-r|-H|-T] [-J] [-t] [-u user] [-n] [-s] [-G|-M] [-1] [-w]\n"
    "\t[ job_identifier... | destination... ]\nqstat -Q [-f] [ destination... ]\n"
    "qstat -q [-G|-M] [ destination... ]\nqstat -B [-f] [ server_name... ]\n"
    "qstat --version\n",
    "torque": "usage: qstat [-f [-1]] [-W site_specific] [-x] [ job_identifier... | "
    "destination... ]\n",
}
# OpenPBS src/lib/Liblog/pbs_messages.c (PBSE_JOBHISTNOTSET) and qstat.c: with -x while
# job_history_enable is off the server refuses the whole request; qstat prints this for each
# operand and exits 0.
HISTORY_OFF = "PBS is not configured to maintain job history"
# PBSE_PERM (15007 & 0xff): a job of another user while query_other_jobs is false; PBS
# Professional's qstat stops at the first one, Torque's goes on (and exits with the first
# error, where PBS Professional exits with the last).
UNAUTHORIZED = ("qstat: Unauthorized Request ", 159)


def _seq(operand: str, cfg: dict) -> int | None:
    head, _, server = operand.partition(".")
    server = server.split("@")[0]
    if not head.isdigit():
        return None
    if server and not (server == cfg["server"] or server.startswith(cfg["server"] + ".")):
        return None
    return int(head)


def _shown_id(operand: str, cfg: dict) -> str:
    return operand if "." in operand else f"{operand}.{cfg['server']}"


def _gone(flavor: str, job: dict, cfg: dict) -> bool:
    """PBS Professional without job history forgets a job once it has finished."""
    return flavor == "pbspro" and job["state"] == DONE and not cfg["job_history_enable"]


def _visible(job: dict, cfg: dict) -> bool:
    uid = os.getuid()
    return uid == 0 or cfg["query_other_jobs"] or job["uid"] == uid


def _listed(flavor: str, job: dict, history: bool) -> bool:
    return history or flavor == "torque" or job["state"] != DONE


def _select(
    flavor: str, data: dict, operands: list[str], history: bool, users: set | None
) -> tuple[list[dict], list[tuple[str, int]]]:
    cfg, jobs = data["config"], data["jobs"]
    if flavor == "pbspro" and history and not cfg["job_history_enable"]:
        shown = [_shown_id(o, cfg) if o[:1].isdigit() else o for o in operands] or [""]
        return [], [(f"qstat: {HISTORY_OFF} {name}".rstrip(), 0) for name in shown]
    ordered = sorted(jobs.values(), key=lambda j: j["id"])
    if not operands:
        chosen = [
            j
            for j in ordered
            if _listed(flavor, j, history)
            and not _gone(flavor, j, cfg)
            and _visible(j, cfg)
            and not (users and j["owner"] not in users)
        ]
        return chosen, []
    chosen, errors = [], []
    for operand in operands:
        if not operand[:1].isdigit():
            queue = operand.split("@")[0]
            chosen.extend(
                j
                for j in ordered
                if (not queue or j["queue"] == queue)
                and _listed(flavor, j, history)
                and not _gone(flavor, j, cfg)
                and _visible(j, cfg)
            )
            continue
        error = _one(flavor, jobs, operand, cfg, history, chosen)
        if error:
            errors.append(error)
            if flavor == "pbspro" and error[1] == UNAUTHORIZED[1]:
                break
    return chosen, errors


def _one(
    flavor: str, jobs: dict, operand: str, cfg: dict, history: bool, chosen: list[dict]
) -> tuple[str, int] | None:
    seq = _seq(operand, cfg)
    job = jobs.get(str(seq)) if seq is not None else None
    shown = _shown_id(operand, cfg)
    if job is None or _gone(flavor, job, cfg):
        text = "Unknown Job Id Error" if flavor == "torque" else "Unknown Job Id"
        return f"qstat: {text} {shown}", 153
    if not _visible(job, cfg):
        return f"{UNAUTHORIZED[0]} {shown}", UNAUTHORIZED[1]
    if not _listed(flavor, job, history):
        return (
            f"qstat: {shown} Job has finished, use -x or -H to obtain historical job information",
            35,
        )
    chosen.append(job)
    return None


def qstat_main(flavor: str, argv: list[str]) -> int:
    if argv == ["--version"]:
        with Sim(flavor).reading() as data:
            version = data["config"]["pbs_version"]
        sys.stdout.write(f"pbs_version = {version}\n" if flavor == "pbspro" else "Version: 6.1.3\n")
        return 0
    try:
        opts, operands = short_options(argv, QSTAT_OPTIONS[flavor])
    except CommandError as exc:
        return fail(CommandError(f"qstat: {exc.message}\n{QSTAT_USAGE[flavor]}", 2))
    flags = dict(opts)
    if "-F" in flags and (flags["-F"] not in ("json", "dsv") or "-f" not in flags):
        return fail(CommandError(QSTAT_USAGE[flavor], 2))
    users = set(flags["-u"].split(",")) if "-u" in flags else None
    sim = Sim(flavor)
    now = time.time()
    with sim.reading() as data:
        chosen, errors = _select(flavor, data, operands, "-x" in flags, users)
        if any(
            j["uid"] == os.getuid() and j["state"] in (QUEUED, RUNNING)
            for j in data["jobs"].values()
        ):
            ensure_supervisor(sim)
        cfg = data["config"]
    for message, _ in errors:
        sys.stderr.write(message + "\n")
    if "-f" not in flags:
        sys.stdout.write(pbs_attributes.table(flavor, chosen, cfg, "-w" in flags))
    elif flags.get("-F") == "json":
        sys.stdout.write(_json(chosen, cfg, sim, now))
    else:
        sys.stdout.write(
            _long(
                flavor,
                chosen,
                cfg,
                sim,
                now,
                "-w" in flags or "-1" in flags,
                flags.get("-F") == "dsv",
            )
        )
    statuses = [status for _, status in errors if status]
    if not statuses:
        return 0
    return statuses[0] if flavor == "torque" else statuses[-1]


def _variables(sim: Sim, job: dict) -> dict:
    try:
        with open(os.path.join(sim.job_dir(job["id"]), "variables.json")) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def _json(chosen: list[dict], cfg: dict, sim: Sim, now: float) -> str:
    report: dict = {
        "timestamp": int(now),
        "pbs_version": cfg["pbs_version"],
        "pbs_server": cfg["server"],
    }
    if chosen:
        report["Jobs"] = {
            f"{j['id']}.{cfg['server']}": pbs_attributes.pbspro(j, cfg, now, _variables(sim, j))
            for j in chosen
        }
    return json.dumps(report, indent=4, separators=(",", ":")) + "\n"


def _long(
    flavor: str, chosen: list[dict], cfg: dict, sim: Sim, now: float, one_line: bool, dsv: bool
) -> str:
    out = []
    for job in chosen:
        variables = _variables(sim, job)
        pairs = (
            pbs_attributes.flatten(pbs_attributes.pbspro(job, cfg, now, variables))
            if flavor == "pbspro"
            else pbs_attributes.torque(job, cfg, now, variables)
        )
        head = f"Job Id: {job['id']}.{cfg['server']}"
        if dsv:
            out.append("|".join([head] + [f"{k} = {v}" for k, v in pairs]) + "\n")
            continue
        out.append(head + "\n")
        for name, value in pairs:
            out.append(pbs_attributes.attribute_line(name, str(value), one_line))
        out.append("\n")
    return "".join(out)


def qdel_main(flavor: str, argv: list[str]) -> int:
    try:
        opts, operands = short_options(argv, "xW:" if flavor == "pbspro" else "pW:m:ab:t:")
    except CommandError:
        opts, operands = [], []
    if not operands:
        usage = (
            "usage:\n\tqdel [-W force|suppress_email=X] [-x] job_identifier...\n\tqdel --version\n"
            if flavor == "pbspro"
            else "usage: qdel [{ -a | -c | -p | -t | -W delay | -m message}] "
            "[<JOBID>[<JOBID>]|'all'|'ALL']...\n"
        )
        return fail(CommandError(usage, 2))
    history = ("-x", "") in opts
    status = 0
    sim = Sim(flavor)
    with sim.writing() as data:
        for operand in operands:
            message, code = _delete(flavor, data, operand, history)
            if message:
                sys.stderr.write(message + "\n")
                status = code
    return status


def _delete(flavor: str, data: dict, operand: str, history: bool) -> tuple[str, int]:
    cfg, now = data["config"], time.time()
    seq = _seq(operand, cfg)
    shown = _shown_id(operand, cfg)
    job = data["jobs"].get(str(seq)) if seq is not None else None
    if job is None or _gone(flavor, job, cfg):
        if seq is None and not operand[:1].isdigit():
            return f"qdel: illegally formed job identifier: {operand}", 1
        return f"qdel: Unknown Job Id {shown}", 153
    if os.getuid() not in (0, job["uid"]):
        return f"qdel: Unauthorized Request  {shown}", 159
    if job["state"] == DONE:
        if history and flavor == "pbspro":
            del data["jobs"][str(job["id"])]
            return "", 0
        if flavor == "torque":
            return (
                "qdel: Request invalid for state of job MSG=invalid state for job - "
                f"COMPLETE {shown}",
                170,
            )
        return f"qdel: Job has finished {shown}", 35
    job["cancel"] = {"time": now, "by": os.getuid()}
    if job["state"] == QUEUED:
        job["kill"] = "cancel"
        finish(job, now, None)
    return "", 0
