"""bsub of IBM Spectrum LSF.

IBM Spectrum LSF 10.1 Command Reference, bsub: options (-J -q -n -R "rusage[mem=]"
-gpu "num=" -W [hour:]minute -P -o/-oo -e/-eo -env -cwd -M -H), job scripts read from
standard input ("bsub < script") or named as the command, '#BSUB' lines in them
(command-line options win), the answer "Job <id> is submitted to [default ]queue
<name>.", refusals ending "Job not submitted." with exit status 255, output files with
%J/%I substituted and the job report appended to the -o file (mailed without -o).

Job arrays: bsub -J "job_name[index_list]%job_slot_limit", the index list comma-separated
start[-end[:step]] of positive integers; each element is a job of its own under the array's
number, with its index in LSB_JOBINDEX and %I (IBM Spectrum LSF 10.1 Command Reference,
bsub -J; "Job arrays"; MAX_JOB_ARRAY_SIZE in lsb.params, default 1000: no index above it).
A bad index list is refused with "Job array index error", one past the limit with "Job
array index too large" (lsberrno LSBE_BAD_IDX, LSBE_BIG_IDX: openlava lsbatch/lib/lsb.err.c).
"""

from __future__ import annotations

import json
import os
import re
import sys

from .common import (
    LOST_REPLY,
    CommandError,
    fail,
    invoking_user,
    parse_size,
    scan_directives,
    take_lost_reply,
)
from .state import Sim, allocate_id, array_element, beyond_host, host_names, new_job
from .supervisor import ensure_supervisor

WITH_VALUE = {
    "-J",
    "-q",
    "-n",
    "-R",
    "-W",
    "-We",
    "-P",
    "-o",
    "-oo",
    "-e",
    "-eo",
    "-env",
    "-gpu",
    "-M",
    "-cwd",
    "-app",
    "-G",
    "-u",
    "-w",
    "-b",
    "-t",
    "-E",
    "-Ep",
    "-i",
    "-L",
    "-m",
    "-sla",
    "-g",
    "-Jd",
    "-c",
    "-C",
    "-D",
    "-F",
    "-S",
    "-v",
    "-T",
    "-k",
    "-f",
    "-a",
    "-ext",
    "-Lp",
    "-hostfile",
    "-data",
    "-datagrp",
    "-rn",
    "-Q",
}
FLAGS = {"-B", "-N", "-H", "-x", "-r", "-K", "-Zs", "-tty"}
INTERACTIVE = {"-I", "-Ip", "-Is", "-IS", "-ISp", "-ISs", "-IX"}
USAGE = (
    "Usage: bsub [-h] [-V] [-H] [-x] [-r] [-N] [-B] [-K]\n"
    '\t[-q queue_name ... ] [-n min_proc[,max_proc]] [-R res_req] [-gpu - | "gpu_req"]\n'
    "\t[-J job_name] [-W [hour:]minute] [-P project_name] [-M mem_limit]\n"
    "\t[-o out_file] [-oo out_file] [-e err_file] [-eo err_file] [-cwd dir]\n"
    '\t[-env "none" | "all, [var_name[=var_value]]"] [command [argument ...]]\n'
)
VERSION = (
    "IBM Spectrum LSF 10.1.0.13, Apr 15 2022\nCopyright International Business "
    "Machines Corp. 1992, 2016.\n"
)


def parse_options(args: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    opts: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            return opts, args[i + 1 :] if arg == "--" else args[i:]
        if arg in INTERACTIVE:
            raise CommandError(
                "Interactive jobs are not supported by this cluster. Job not submitted.", 255
            )
        if arg in WITH_VALUE:
            i += 1
            if i >= len(args):
                raise CommandError(f"bsub: option requires an argument -- {arg[1:]}\n{USAGE}", 255)
            opts.append((arg, args[i]))
        elif arg in FLAGS:
            opts.append((arg, ""))
        elif arg[:2] in WITH_VALUE and len(arg) > 2:
            opts.append((arg[:2], arg[2:]))
        else:
            raise CommandError(f"bsub: illegal option -- {arg[1:]}\n{USAGE}", 255)
        i += 1
    return opts, []


def _script(command: list[str]) -> tuple[str, str | None]:
    """(job script text, the command line); stdin is the script when no command is given."""
    if not command:
        return sys.stdin.read(), None
    line = " ".join(command)
    if len(command) == 1 and os.path.isfile(command[0]):
        try:
            with open(command[0], errors="replace") as handle:
                return handle.read(), line
        except OSError:
            pass
    return "", line


def _runlimit(value: str, minute: float) -> int:
    spec = value.split("/")[0]
    if not re.fullmatch(r"(\d+:)?\d+", spec):
        raise CommandError(f"{value}: Bad RUNLIMIT specification. Job not submitted.", 255)
    hours, _, minutes = spec.rpartition(":")
    return int(((int(hours) if hours else 0) * 60 + int(minutes)) * minute)


def _memory_mb(requirements: list[str]) -> int | None:
    found = None
    for text in requirements:
        for section in re.findall(r"rusage\[([^\]]*)\]", text):
            match = re.search(r"\bmem=([\d.]+)\s*([KMGT]?)B?\b", section, re.IGNORECASE)
            if match:
                number, unit = float(match.group(1)), (match.group(2) or "M").upper()
                found = int(number * {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[unit])
    return found


def _gpus(value: str | None) -> int:
    if value is None:
        return 0
    if value.strip() == "-":
        return 1
    match = re.search(r"(?:^|:)\s*num=(\d+)", value)
    return int(match.group(1)) if match else 1


def _environment(value: str | None, user: dict) -> dict:
    """-env: "all" (the default), "none", "all, ~VAR, VAR=val", or "VAR[=val], ..."."""
    basics = {
        "HOME": user["home"],
        "USER": user["name"],
        "LOGNAME": user["name"],
        "SHELL": user["shell"],
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }
    if value is None:
        return dict(os.environ)
    items = [i.strip() for i in value.split(",") if i.strip()]
    if items and items[0].lower() == "none":
        return basics
    env = dict(os.environ)
    for item in items:
        if item.lower() == "all":
            continue
        if item.startswith("~"):
            env.pop(item[1:], None)
            continue
        name, eq, val = item.partition("=")
        env[name] = val if eq else os.environ.get(name, "")
    return env


def _path(value: str | None, seq: int, cwd: str, suffix: str, index: int = 0) -> str | None:
    """An output file: %J the job's (or array's) number, %I the element's index (0 outside
    an array); a folder gets <number>.out, an element's <number>.<index>.out."""
    if not value:
        return None
    path = os.path.join(
        cwd, os.path.expanduser(value.replace("%J", str(seq)).replace("%I", str(index)))
    )
    if value.endswith("/") or os.path.isdir(path):
        name = f"{seq}.{index}" if index else str(seq)
        path = os.path.join(path, f"{name}.{suffix}")
    return os.path.normpath(path)


_ARRAY_SPEC = re.compile(r"(?P<name>[^\[\]]*)\[(?P<indices>[^\[\]]*)\](?:%(?P<limit>\d+))?")
_INDEX_RANGE = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")


def array_spec(value: str, largest: int) -> tuple[str, list[int]] | None:
    """bsub -J "name[index_list]%limit": the array's name and its indices in order (None: a
    plain job's name). Each entry of the list is start[-end[:step]], positive integers; an
    index above MAX_JOB_ARRAY_SIZE is refused. The slot limit is accepted, not enforced."""
    if "[" not in value and "]" not in value:
        return None
    match = _ARRAY_SPEC.fullmatch(value.strip())
    if match is None:
        raise CommandError("Job array index error. Job not submitted.", 255)
    indices: list[int] = []
    for entry in match["indices"].split(","):
        found = _INDEX_RANGE.fullmatch(entry.strip())
        if found is None:
            raise CommandError("Job array index error. Job not submitted.", 255)
        start = int(found[1])
        end = int(found[2]) if found[2] else start
        step = int(found[3]) if found[3] else 1
        if start < 1 or end < start or step < 1:
            raise CommandError("Job array index error. Job not submitted.", 255)
        indices += [i for i in range(start, end + 1, step) if i not in indices]
    if max(indices) > largest:
        raise CommandError("Job array index too large. Job not submitted.", 255)
    return match["name"], indices


def bsub_main(flavor: str, argv: list[str]) -> int:
    if argv in (["-V"], ["-h"]):
        sys.stderr.write(VERSION if argv == ["-V"] else USAGE)
        return 0
    try:
        sim, seq, queue, default_queue = submit(argv)
    except CommandError as error:
        return fail(error)
    if take_lost_reply(sim.dir):  # mbatchd queued it; its reply lost
        ensure_supervisor(sim)
        return fail(CommandError(LOST_REPLY["lsf"], 255))
    where = "default queue" if default_queue else "queue"
    sys.stdout.write(f"Job <{seq}> is submitted to {where} <{queue}>.\n")
    sys.stdout.flush()
    ensure_supervisor(sim)
    return 0


def _settings(argv: list[str]) -> tuple[dict, list[str], str, str | None]:
    cli, command = parse_options(argv)
    text, line = _script(command)
    directives: list = []
    for words in scan_directives(text, "#BSUB"):
        found, extra = parse_options(words)
        if extra:
            raise CommandError(f"{' '.join(words)}: Bad #BSUB line. Job not submitted.", 255)
        directives.extend(found)
    settings: dict = {"-R": []}
    for name, value in directives + cli:
        if name == "-R":
            settings["-R"].append(value)
        else:
            settings[name] = value
    return settings, command, text, line


def submit(argv: list[str]) -> tuple[Sim, int, str, bool]:
    settings, command, text, line = _settings(argv)
    user = invoking_user()
    cwd = os.getcwd()
    workdir = os.path.join(cwd, settings["-cwd"]) if "-cwd" in settings else cwd
    try:
        slots = int(settings.get("-n", "1").split(",")[0])
        memlimit = parse_size(settings["-M"], "kb") // 1024 if "-M" in settings else None
    except ValueError as exc:
        raise CommandError("Bad argument for option -n or -M. Job not submitted.", 255) from exc
    sim = Sim("lsf")
    with sim.writing() as data:
        cfg = data["config"]
        queue = settings.get("-q", cfg["queues"][0]).split()[0]
        if queue not in cfg["queues"]:
            raise CommandError(f"{queue}: No such queue. Job not submitted.", 255)
        seq = allocate_id(data)
        walltime = _runlimit(settings["-W"], cfg["lsf_minute"]) if "-W" in settings else None
        out_value = settings.get("-oo", settings.get("-o"))
        err_value = settings.get("-eo", settings.get("-e"))
        stdout = _path(out_value, seq, workdir, "out")
        stderr = _path(err_value, seq, workdir, "err")
        if stdout is None:
            stdout = _mailbox(sim, user, seq)
        name = settings.get("-J") or line or (text.splitlines() or ["NONAME"])[0]
        array = array_spec(name, cfg["max_job_array_size"]) if "-J" in settings else None
        if array is not None:
            name = array[0]
        job = new_job(
            "lsf",
            seq,
            user,
            name=name,
            queue=queue,
            ncpus=slots,
            ngpus=_gpus(settings.get("-gpu")),
            mem_mb=_memory_mb(settings["-R"]),
            walltime=walltime,
            project=settings.get("-P"),
            submit_cwd=cwd,
            workdir=workdir,
            join=None,
            stdout=stdout,
            stderr=stderr or stdout,
            append="-oo" not in settings,
            held="-H" in settings,
        )
        ptile = _ptile(settings["-R"])
        hosts = -(-slots // ptile) if ptile else 1
        if beyond_host(job, cfg) or hosts > len(host_names(cfg)):
            raise CommandError(
                "Too many processors requested. Job not submitted."
                if job["ncpus"] > cfg["cpus"]
                else "Job requirements for reserving resources exceed the cluster. "
                "Job not submitted.",
                255,
            )
        job["native"] = {
            "output_file": out_value,
            "error_file": err_value,
            "command": line,
            "memlimit": memlimit,
            "runlimit_minutes": (walltime / cfg["lsf_minute"]) if walltime else None,
            "resreq": " ".join(settings["-R"]),
            "gpu": settings.get("-gpu"),
            "hosts": hosts,
            "ptile": ptile or slots,
        }
        environment = _environment(settings.get("-env"), user)
        # An array is only its elements: bjobs shows each on its own line, none for the array.
        elements = [job]
        if array is not None:
            elements = [array_element(data, job, index) for index in array[1]]
        for element in elements:
            index = element["array"]["index"] if element.get("array") else 0
            if index:
                element["name"] = f"{name}[{index}]"
                element["stdout"] = _path(out_value, seq, workdir, "out", index)
                element["stderr"] = _path(err_value, seq, workdir, "err", index)
                element["stdout"] = element["stdout"] or _mailbox(sim, user, f"{seq}.{index}")
                element["stderr"] = element["stderr"] or element["stdout"]
            job_dir = sim.job_dir(element["id"])
            element["argv"] = _job_argv(job_dir, command, text, line)
            _store(job_dir, text if not command else line or "", environment)
            data["jobs"][str(element["id"])] = element
    return sim, seq, queue, "-q" not in settings


def _mailbox(sim: Sim, user: dict, seq: int | str) -> str:
    """Without -o LSF mails the output and report; the simulator keeps them here."""
    folder = os.path.join(sim.dir, "mail")
    os.makedirs(folder, exist_ok=True)
    if os.stat(folder).st_uid == os.getuid():
        os.chmod(folder, 0o777)
    return os.path.join(folder, f"{user['name']}.{seq}")


def _job_argv(job_dir: str, command: list[str], text: str, line: str | None) -> list[str]:
    if command:
        return ["/bin/sh", "-c", line or ""]
    script = os.path.join(job_dir, "script")
    return [script] if text.startswith("#!") else ["/bin/sh", script]


def _store(job_dir: str, script: str, env: dict) -> None:
    os.makedirs(job_dir, exist_ok=True)
    os.chmod(job_dir, 0o777)
    path = os.path.join(job_dir, "script")
    with open(path, "w") as handle:
        handle.write(script)
    os.chmod(path, 0o755)
    path = os.path.join(job_dir, "env.json")
    with open(path, "w") as handle:
        json.dump(env, handle)
    os.chmod(path, 0o666)


def _ptile(requirements: list[str]) -> int | None:
    """bsub -R "span[ptile=K]": K slots on each host, so -n N takes ceil(N/K) hosts (IBM
    Spectrum LSF 10.1, "Specify span string"); span[hosts=1] and no span: one host."""
    for text in requirements:
        found = re.search(r"span\[ptile=(\d+)\]", text)
        if found and int(found.group(1)) > 0:
            return int(found.group(1))
    return None
