"""qstat and qdel of PBS Professional and Torque.

PBS Professional Reference Guide: qstat(1B) (default format, -f long format, -F json,
-x history, -w), qdel(1B) (-x, -W force); OpenPBS src/cmds/qstat.c and qdel.c for the
messages and exit statuses: "qstat: Unknown Job Id <id>" exits 153 (PBSE_UNKJOBID
15001 & 0xff), "qstat: <id> Job has finished, use -x or -H to obtain historical job
information" exits 35 (PBSE_HISTJOBID 15139 & 0xff), "qdel: Job has finished <id>"
exits 35, "qdel: Unauthorized Request  <id>" exits 159 (PBSE_PERM).
TORQUE 6.1 qstat/qdel: "qstat: Unknown Job Id Error <id>" (153), completed jobs stay
in state C for keep_completed, "qdel: Request invalid for state of job MSG=invalid
state for job - COMPLETE <id>" (170, PBSE_BADSTATE 15018 in Torque's numbering); job arrays
as torque_arrays describes; `qstat -B -f` the server's attributes (max_job_array_size).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

from . import pbs_arrays, pbs_attributes, torque_arrays
from .common import CommandError, fail, short_options
from .state import DONE, QUEUED, RUNNING, Sim, finish, shown_id
from .supervisor import ensure_supervisor

QSTAT_OPTIONS = {"pbspro": "fF:xwu:1tJB", "torque": "f1u:tB"}
QSTAT_USAGE = {
    "pbspro": "usage: \nqstat [-f] [-J] [-p] [-t] [-x] [-E] "
    "[ job_identifier... | destination... ]\n"
    "qstat [-a|-i|-r|-H|-T] [-J] [-t] [-u user] [-n] [-s] [-G|-M] [-1] [-w]\n"
    "\t[ job_identifier... | destination... ]\nqstat -Q [-f] [ destination... ]\n"
    "qstat -q [-G|-M] [ destination... ]\nqstat -B [-f] [ server_name... ]\n"
    "qstat --version\n",
    "torque": "usage: qstat [-f [-1]] [-W site_specific] [-x] [ job_identifier... | "
    "destination... ]\n"
    "qstat -B [-f [-1]] [-W site_specific] [ server_name... ]\nqstat -t\n",
}
# OpenPBS src/lib/Liblog/pbs_messages.c (PBSE_JOBHISTNOTSET) and qstat.c: with -x while
# job_history_enable is off the server refuses the whole request; qstat prints this for each
# operand and exits 0.
HISTORY_OFF = "PBS is not configured to maintain job history"
# PBSE_PERM (15007 & 0xff): a job of another user while query_other_jobs is false; PBS
# Professional's qstat stops at the first one, Torque's goes on (and exits with the first
# error, where PBS Professional exits with the last).
UNAUTHORIZED = ("qstat: Unauthorized Request ", 159)


@dataclass(frozen=True)
class Shown:
    """One record qstat shows: a job, an array job (`N[]`) or a subjob (`N[i]`)."""

    head: str  # the id before the server's name
    job: dict  # the job, the subjob, or the array's first subjob
    subjobs: tuple[dict, ...] = ()  # the array's subjobs (an array job or a subjob)

    def attributes(self, cfg: dict, now: float, variables: dict) -> dict:
        if not self.subjobs:
            return pbs_attributes.pbspro(self.job, cfg, now, variables)
        if self.head.endswith("[]"):
            return pbs_arrays.parent_record(list(self.subjobs), cfg, now, variables)
        return pbs_arrays.subjob_record(self.job, list(self.subjobs), cfg, now, variables)

    def torque_pairs(self, cfg: dict, now: float, variables: dict) -> list:
        if self.head.endswith("[]"):
            return torque_arrays.summary_pairs(list(self.subjobs), cfg, now, variables)
        return pbs_attributes.torque(self.job, cfg, now, variables)

    def row(self, cfg: dict, flavor: str) -> dict:
        """The job as the one-line format reads it, in the record's state."""
        if not self.subjobs:
            return self.job
        if flavor == "torque" and self.head.endswith("[]"):
            return torque_arrays.summary_row(list(self.subjobs))
        if flavor == "torque":
            return {**self.job, "shown": self.head}
        if self.head.endswith("[]"):
            letter = pbs_arrays.parent_state(list(self.subjobs))
        else:
            history = cfg["job_history_enable"]
            letter = pbs_arrays.subjob_state(self.job, list(self.subjobs), history)
        return {**self.job, "shown": self.head, "letter": letter}


def parse_operand(operand: str, cfg: dict) -> tuple[int, str | None] | None:
    """A job id operand: (number, None), or (number, "" or the index) for an array's."""
    head, _, server = operand.partition(".")
    server = server.split("@")[0]
    parts = pbs_arrays.split_id(head)
    if parts is None:
        return None
    if server and not (server == cfg["server"] or server.startswith(cfg["server"] + ".")):
        return None
    return parts


def operand_id(operand: str, cfg: dict) -> str:
    return operand if "." in operand else f"{operand}.{cfg['server']}"


def forgotten(flavor: str, job: dict, cfg: dict) -> bool:
    """PBS Professional without job history forgets a job once it has finished."""
    return flavor == "pbspro" and job["state"] == DONE and not cfg["job_history_enable"]


def array_forgotten(subjobs: list[dict], cfg: dict, flavor: str = "pbspro") -> bool:
    """An array leaves the server once every subjob has ended, unless it keeps job history
    (PBS Professional); Torque's stays while any subjob does (completed, for keep_completed)."""
    finished = pbs_arrays.finished(subjobs)
    return flavor == "pbspro" and finished and not cfg["job_history_enable"]


def _visible(job: dict, cfg: dict) -> bool:
    uid = os.getuid()
    return uid == 0 or cfg["query_other_jobs"] or job["uid"] == uid


def _listed(flavor: str, job: dict, history: bool) -> bool:
    return history or flavor == "torque" or job["state"] != DONE


def _array_listed(flavor: str, subjobs: list[dict], cfg: dict, history: bool) -> bool:
    if flavor == "torque":
        return True
    finished = pbs_arrays.finished(subjobs)
    return (history or not finished) and not array_forgotten(subjobs, cfg)


def _shown_array(flavor: str, subjobs: list[dict], flags: dict) -> list[Shown]:
    """An array as qstat shows it: PBS Professional's array job, with -t its subjobs after it
    (with -J -t its subjobs only); Torque's summary, or with -t its subjobs only."""
    if flavor == "torque":
        return _array(subjobs, "-t" in flags, "-t" not in flags)
    return _array(subjobs, "-t" in flags, not ("-J" in flags and "-t" in flags))


def _array(subjobs: list[dict], with_subjobs: bool, array_too: bool = True) -> list[Shown]:
    """The array job, then (qstat -t) each of its subjobs."""
    number = subjobs[0]["array"]["id"]
    found = [Shown(f"{number}[]", subjobs[0], tuple(subjobs))] if array_too else []
    if with_subjobs:
        found += [Shown(shown_id(j), j, tuple(subjobs)) for j in subjobs]
    return found


def _select(
    flavor: str, data: dict, operands: list[str], flags: dict, users: set | None
) -> tuple[list[Shown], list[tuple[str, int]]]:
    cfg, jobs = data["config"], data["jobs"]
    history = "-x" in flags
    if flavor == "pbspro" and history and not cfg["job_history_enable"]:
        shown = [operand_id(o, cfg) if o[:1].isdigit() else o for o in operands] or [""]
        return [], [(f"qstat: {HISTORY_OFF} {name}".rstrip(), 0) for name in shown]
    if not operands:
        return _every(flavor, data, None, flags, users), []
    chosen: list[Shown] = []
    errors = []
    for operand in operands:
        if not operand[:1].isdigit():
            chosen += _every(flavor, data, operand.split("@")[0], flags, None)
            continue
        error = _one(flavor, jobs, operand, cfg, flags, chosen)
        if error:
            errors.append(error)
            if flavor == "pbspro" and error[1] == UNAUTHORIZED[1]:
                break
    return chosen, errors


def _every(
    flavor: str, data: dict, queue: str | None, flags: dict, users: set | None
) -> list[Shown]:
    """Every job shown (of a queue, of users): an array as its array job, and with -t its
    subjobs after it; with -J arrays only, and with -J -t their subjobs only (qstat(1B))."""
    cfg, history = data["config"], "-x" in flags
    groups = pbs_arrays.arrays(data["jobs"])
    found: list[Shown] = []
    for job in sorted(data["jobs"].values(), key=lambda j: j["id"]):
        subjobs = groups.get(job["array"]["id"]) if job.get("array") else None
        if subjobs is not None and job is not subjobs[0]:
            continue
        if subjobs is None and ("-J" in flags or not _listed(flavor, job, history)):
            continue
        if subjobs is None and forgotten(flavor, job, cfg):
            continue
        if subjobs is not None and not _array_listed(flavor, subjobs, cfg, history):
            continue
        if queue and job["queue"] != queue or not _visible(job, cfg):
            continue
        if users and job["owner"] not in users:
            continue
        if subjobs is None:
            found.append(Shown(str(job["id"]), job))
        else:
            found += _shown_array(flavor, subjobs, flags)
    return found


def _one(
    flavor: str, jobs: dict, operand: str, cfg: dict, flags: dict, chosen: list[Shown]
) -> tuple[str, int] | None:
    parsed = parse_operand(operand, cfg)
    shown = operand_id(operand, cfg)
    unknown = f"qstat: {'Unknown Job Id Error' if flavor == 'torque' else 'Unknown Job Id'} {shown}"
    history = "-x" in flags
    if parsed is not None and parsed[1] is not None:
        # stat_a_jobidname (req_stat.c): N[] is the array job, N[i] one subjob.
        number, index = parsed
        subjobs = pbs_arrays.arrays(jobs).get(number)
        if flavor == "torque" and not subjobs and index == "":
            message, status = torque_arrays.UNKNOWN_ARRAY
            return f"qstat: {message} {shown}", status
        if not subjobs or array_forgotten(subjobs, cfg, flavor):
            return unknown, 153
        if not _visible(subjobs[0], cfg) and flavor == "torque" and index == "":
            # TORQUE src/server/req_stat.c: an array's jobs (tjstArray) that the asker may
            # not see are skipped without the permission error: nothing shown, exit 0.
            return None
        if not _visible(subjobs[0], cfg):
            return f"{UNAUTHORIZED[0]} {shown}", UNAUTHORIZED[1]
        if not _array_listed(flavor, subjobs, cfg, history):
            return _finished_message(shown)
        if index == "":
            chosen += _shown_array(flavor, subjobs, flags)
            return None
        match = [j for j in subjobs if str(j["array"]["index"]) == index]
        if not match:
            return unknown, 153
        chosen.append(Shown(shown_id(match[0]), match[0], tuple(subjobs)))
        return None
    job = jobs.get(str(parsed[0])) if parsed is not None else None
    if job is None or job.get("array") or forgotten(flavor, job, cfg):
        return unknown, 153
    if not _visible(job, cfg):
        return f"{UNAUTHORIZED[0]} {shown}", UNAUTHORIZED[1]
    if not _listed(flavor, job, history):
        return _finished_message(shown)
    chosen.append(Shown(str(job["id"]), job))
    return None


def _finished_message(shown: str) -> tuple[str, int]:
    return (
        f"qstat: {shown} Job has finished, use -x or -H to obtain historical job information",
        35,
    )


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
    if "-B" in flags and flavor == "pbspro":
        return _server_status(sim, flags, now)
    if "-B" in flags:
        return _torque_server_status(sim, flags)
    with sim.reading() as data:
        chosen, errors = _select(flavor, data, operands, flags, users)
        if any(
            j["uid"] == os.getuid() and j["state"] in (QUEUED, RUNNING)
            for j in data["jobs"].values()
        ):
            ensure_supervisor(sim)
        cfg = data["config"]
    for message, _ in errors:
        sys.stderr.write(message + "\n")
    if "-f" not in flags:
        rows = [shown.row(cfg, flavor) for shown in chosen]
        sys.stdout.write(pbs_attributes.table(flavor, rows, cfg, "-w" in flags))
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


def _server_status(sim: Sim, flags: dict, now: float) -> int:
    """qstat -B [-f [-F json]]: the server's attributes (Reference Guide, qstat(1B) "Server
    status", pbs_server_attributes(7B)): max_array_size (default 10000) and a few others."""
    with sim.reading() as data:
        cfg, jobs = data["config"], list(data["jobs"].values())
    counts = {"Queued": 0, "Running": 0}
    for job in jobs:
        if job["state"] in (QUEUED, RUNNING):
            counts["Queued" if job["state"] == QUEUED else "Running"] += 1
    attrs: dict = {
        "server_state": "Active",
        "server_host": cfg["server"],
        "scheduling": "True",
        "total_jobs": sum(counts.values()),
        "state_count": f"Transit:0 Queued:{counts['Queued']} Held:0 Waiting:0 "
        f"Running:{counts['Running']} Exiting:0 Begun:0 ",
        "default_queue": cfg["queues"][0],
        "query_other_jobs": "True" if cfg["query_other_jobs"] else "False",
        "resources_default": {"ncpus": 1},
        "default_chunk": {"ncpus": 1},
        "max_array_size": cfg["max_array_size"],
        "pbs_version": cfg["pbs_version"],
    }
    if cfg["job_history_enable"]:
        attrs["job_history_enable"] = "True"
    if flags.get("-F") == "json":
        report = {
            "timestamp": int(now),
            "pbs_version": cfg["pbs_version"],
            "pbs_server": cfg["server"],
            "Server": {cfg["server"]: attrs},
        }
        sys.stdout.write(json.dumps(report, indent=4, separators=(",", ":")) + "\n")
    elif "-f" in flags:
        lines = [f"Server: {cfg['server']}"]
        lines += [f"    {k} = {v}" for k, v in pbs_attributes.flatten(attrs)]
        sys.stdout.write("\n".join(lines) + "\n\n")
    else:
        head = "Server             Max   Tot   Que   Run   Hld   Wat   Trn   Ext Status"
        row = (
            f"{cfg['server'][:16]:<16} {0:>5} {attrs['total_jobs']:>5} {counts['Queued']:>5} "
            f"{counts['Running']:>5} {0:>5} {0:>5} {0:>5} {0:>5} Active"
        )
        sys.stdout.write(
            f"{head}\n{'-' * 16} ----- ----- ----- ----- ----- ----- ----- ----- ------\n{row}\n"
        )
    return 0


def _torque_server_status(sim: Sim, flags: dict) -> int:
    """Torque's qstat -B -f: the server's attributes (TORQUE 6.1 "Server parameters"), among
    them max_job_array_size where it is set."""
    with sim.reading() as data:
        cfg, jobs = data["config"], list(data["jobs"].values())
    counts = {state: sum(j["state"] == state for j in jobs) for state in (QUEUED, RUNNING, DONE)}
    attrs: dict = {
        "server_state": "Active",
        "scheduling": "True",
        "total_jobs": len(jobs),
        "state_count": f"Transit:0 Queued:{counts[QUEUED]} Held:0 Waiting:0 "
        f"Running:{counts[RUNNING]} Exiting:0 Complete:{counts[DONE]} ",
        "default_queue": cfg["queues"][0],
        "query_other_jobs": "True" if cfg["query_other_jobs"] else "False",
        "keep_completed": int(cfg["keep"]),
        "pbs_version": "6.1.3",
    }
    if cfg.get("max_job_array_size") is not None:
        attrs["max_job_array_size"] = cfg["max_job_array_size"]
    if "-f" not in flags:
        sys.stdout.write(f"Server: {cfg['server']}\n")
        return 0
    lines = [f"Server: {cfg['server']}"] + [f"    {k} = {v}" for k, v in attrs.items()]
    sys.stdout.write("\n".join(lines) + "\n\n")
    return 0


def _variables(sim: Sim, job: dict) -> dict:
    try:
        with open(os.path.join(sim.job_dir(job["id"]), "variables.json")) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def _json(chosen: list[Shown], cfg: dict, sim: Sim, now: float) -> str:
    report: dict = {
        "timestamp": int(now),
        "pbs_version": cfg["pbs_version"],
        "pbs_server": cfg["server"],
    }
    if chosen:
        report["Jobs"] = {
            f"{j.head}.{cfg['server']}": j.attributes(cfg, now, _variables(sim, j.job))
            for j in chosen
        }
    return json.dumps(report, indent=4, separators=(",", ":")) + "\n"


def _long(
    flavor: str, chosen: list[Shown], cfg: dict, sim: Sim, now: float, one_line: bool, dsv: bool
) -> str:
    out = []
    for shown in chosen:
        variables = _variables(sim, shown.job)
        pairs = (
            pbs_attributes.flatten(shown.attributes(cfg, now, variables))
            if flavor == "pbspro"
            else shown.torque_pairs(cfg, now, variables)
        )
        head = f"Job Id: {shown.head}.{cfg['server']}"
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
    cfg = data["config"]
    parsed = parse_operand(operand, cfg)
    shown = operand_id(operand, cfg)
    if parsed is None:
        if not operand[:1].isdigit():
            return f"qdel: illegally formed job identifier: {operand}", 1
        return f"qdel: Unknown Job Id {shown}", 153
    number, index = parsed
    if index is not None:
        return _delete_in_array(flavor, data, number, index, shown, history)
    job = data["jobs"].get(str(number))
    if job is None or job.get("array") or forgotten(flavor, job, cfg):
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
    _cancel(job)
    return "", 0


def _cancel(job: dict) -> None:
    now = time.time()
    job["cancel"] = {"time": now, "by": os.getuid()}
    if job["state"] == QUEUED:
        job["kill"] = "cancel"
        finish(job, now, None)


def _delete_in_array(
    flavor: str, data: dict, number: int, index: str, shown: str, history: bool
) -> tuple[str, int]:
    """req_delete.c: `N[]` deletes every subjob that has not ended, `N[i]` one subjob (a
    queued one just expires); an ended subjob is refused (PBSE_NOHISTARRAYSUBJOB), and an
    index outside the array is an invalid request (PBSE_IVALREQ 15004 & 0xff)."""
    subjobs = pbs_arrays.arrays(data["jobs"]).get(number)
    if flavor == "torque":
        return _delete_in_torque_array(subjobs or [], index, shown)
    if not subjobs or array_forgotten(subjobs, data["config"]):
        return f"qdel: Unknown Job Id {shown}", 153
    if os.getuid() not in (0, subjobs[0]["uid"]):
        return f"qdel: Unauthorized Request  {shown}", 159
    if index == "":
        if pbs_arrays.finished(subjobs) and history:
            for job in subjobs:
                del data["jobs"][str(job["id"])]
            return "", 0
        if pbs_arrays.finished(subjobs):
            return f"qdel: Job has finished {shown}", 35
        for job in subjobs:
            if job["state"] != DONE:
                _cancel(job)
        return "", 0
    match = [j for j in subjobs if str(j["array"]["index"]) == index]
    if not match:
        return f"qdel: Invalid request {shown}", 156
    if match[0]["state"] == DONE:
        message, status = pbs_arrays.NOHISTARRAYSUBJOB
        return f"qdel: {message} {shown}", status
    _cancel(match[0])
    return "", 0


def _delete_in_torque_array(subjobs: list[dict], index: str, shown: str) -> tuple[str, int]:
    """req_deletearray.c: `N[]` deletes the subjobs that have not completed, and is
    acknowledged for an array the server does not have; `N[i]` is that subjob's own qdel."""
    if subjobs and os.getuid() not in (0, subjobs[0]["uid"]):
        return f"qdel: Unauthorized Request  {shown}", 159
    if index == "":
        torque_arrays.delete_array(subjobs, _cancel)
        return "", 0
    match = [j for j in subjobs if str(j["array"]["index"]) == index]
    if not match:
        return f"qdel: Unknown Job Id {shown}", 153
    if match[0]["state"] == DONE:
        return (
            f"qdel: Request invalid for state of job MSG=invalid state for job - COMPLETE {shown}",
            170,
        )
    _cancel(match[0])
    return "", 0
