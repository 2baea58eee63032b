"""qsub of PBS Professional and Torque.

PBS Professional Reference Guide, qsub(1B): OPTIONS, OPERANDS, "PBS directives"
(command line wins over #PBS lines), STANDARD OUTPUT (the job id), ENVIRONMENT
VARIABLES (PBS_O_*), EXIT STATUS (0, or >0: the server's PBSE_* code & 0xff).
TORQUE Administrator Guide 6.1, qsub: the same, plus -d/-w (working directory),
"qsub: submit error (...)" messages and -t (job arrays, torque_arrays).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys

from . import pbs_arrays, pbs_resources, torque_arrays
from .common import (
    LOST_REPLY,
    CommandError,
    fail,
    invoking_user,
    scan_directives,
    short_host,
    take_lost_reply,
)
from .state import Sim, allocate_id, array_element, beyond_host, host_names, new_job
from .supervisor import ensure_supervisor

WITH_VALUE = {"pbspro": set("aAcCeJjklmMNopPqrRSuvW"), "torque": set("aAbcCdDeFjklmMNopPqrSutvwW")}
FLAGS = {"pbspro": set("fhIVXz"), "torque": set("fhIVxXz")}
USAGE = {
    "pbspro": "usage: qsub [-a date_time] [-A account_string] [-c interval]\n"
    "\t[-C directive_prefix] [-e path] [-f ] [-h ] [-I [-X]] [-j oe|eo] [-J X-Y[:Z]]\n"
    "\t[-k keep] [-l resource_list] [-m mail_options] [-M user_list]\n"
    "\t[-N jobname] [-o path] [-p priority] [-P project] [-q queue] [-r y|n]\n"
    "\t[-R o|e|oe] [-S path] [-u user_list] [-W otherattributes=value...]\n"
    "\t[-v variable_list] [-V ] [-z] [script | -- command [arg1 ...]]\n"
    "       qsub --version\n",
    "torque": "usage: qsub [-a date_time] [-A account_string] [-b secs]\n"
    "      [-c [ none | { enabled | periodic | shutdown |\n"
    "      depth=<int> | dir=<path> | interval=<minutes>}... ]\n"
    "      [-C directive_prefix] [-d path] [-D path]\n"
    "      [-e path] [-h] [-I] [-j oe|eo|n] [-k {oe}] [-K interval] [-l resource_list]\n"
    "      [-m n|{abe}] [-M user_list] [-N jobname] [-o path] [-p priority]\n"
    "      [-q queue] [-r y|n] [-S path] [-t number_to_submit] [-T type]"
    "  [-u user_list]\n"
    "      [-w] path\n"
    "      [-W additional_attributes] [-v variable_list] [-V ] [-x] [-X] [-z] [script]\n",
}
VERSION = {"pbspro": "pbs_version = 2022.1.3\n", "torque": "Version: 6.1.3\nCommit: 0\n"}


def _usage(flavor: str) -> CommandError:
    return CommandError(USAGE[flavor], 2)


def parse_options(flavor: str, args: list[str]) -> tuple[list, list[str] | None, list | None]:
    """getopt-style: (option pairs, operands, executable argv after '--')."""
    opts: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return opts, [], args[i + 1 :]
        if not arg.startswith("-") or arg == "-":
            return opts, args[i:], None
        letters, j = arg[1:], 0
        while j < len(letters):
            letter = letters[j]
            if letter in WITH_VALUE[flavor]:
                value = letters[j + 1 :]
                if not value:
                    i += 1
                    if i >= len(args):
                        raise _usage(flavor)
                    value = args[i]
                opts.append((letter, value))
                break
            if letter in FLAGS[flavor]:
                opts.append((letter, None))
                j += 1
                continue
            raise CommandError(f"qsub: invalid option -- '{letter}'\n{USAGE[flavor]}", 2)
        i += 1
    return opts, [], None


def _read_script(flavor: str, operands: list[str]) -> tuple[str, str | None]:
    """(script text, script path or None for standard input)."""
    if len(operands) > 1:
        raise _usage(flavor)
    if not operands or operands[0] == "-":
        return sys.stdin.read(), None
    path = operands[0]
    try:
        with open(path, errors="replace") as handle:
            return handle.read(), path
    except OSError as exc:
        if flavor == "torque":
            raise CommandError(
                f"qsub: script file '{path}' cannot be loaded - {exc.strerror}", 1
            ) from exc
        raise CommandError(f"qsub: script file:: {exc.strerror}", 1) from exc


def _collect(pairs: list) -> dict:
    """Fold option pairs into settings; later pairs win, -l and -v accumulate."""
    found: dict = {"l": [], "v": [], "W": []}
    for letter, value in pairs:
        if letter in "lvW":
            found[letter].append(value)
        else:
            found[letter] = value if value is not None else True
    return found


def _comma_token(text: str) -> list[str]:
    """qsub's comma_token(): commas inside quotes do not split."""
    items, quote, current = [], "", ""
    for char in text:
        if char in "'\"":
            quote = "" if quote == char else (quote or char)
            continue
        if char == "," and not quote:
            items.append(current)
            current = ""
            continue
        current += char
    items.append(current)
    return [i.strip() for i in items if i.strip()]


def _variables(settings: dict, queue: str, cwd: str, user: dict) -> dict:
    env = os.environ
    variables = {
        "PBS_O_HOME": env.get("HOME", user["home"]),
        "PBS_O_LANG": env.get("LANG"),
        "PBS_O_LOGNAME": env.get("LOGNAME", user["name"]),
        "PBS_O_PATH": env.get("PATH"),
        "PBS_O_MAIL": env.get("MAIL"),
        "PBS_O_SHELL": env.get("SHELL", user["shell"]),
        "PBS_O_TZ": env.get("TZ"),
        "PBS_O_WORKDIR": cwd,
        "PBS_O_SYSTEM": os.uname().sysname,
        "PBS_O_QUEUE": queue,
        "PBS_O_HOST": short_host(),
    }
    variables = {k: v for k, v in variables.items() if v is not None}
    if settings.get("V"):
        variables.update({k: v for k, v in env.items() if not k.startswith("PBS_O_")})
    for item in (i for text in settings["v"] for i in _comma_token(text)):
        name, eq, value = item.partition("=")
        if eq:
            variables[name] = value
        elif name in env:
            variables[name] = env[name]
        else:
            raise CommandError("qsub: cannot send environment with the job", 1)
    return variables


def _output_path(value: str | None, default_name: str, suffix: str, full: str, cwd: str) -> str:
    if not value:
        return os.path.join(cwd, default_name)
    path = value.split(":", 1)[1] if re.match(r"^[\w.-]+:/", value) else value
    path = os.path.join(cwd, os.path.expanduser(path))
    if path.endswith("/") or os.path.isdir(path):
        path = os.path.join(path, f"{full}.{suffix}")
    return os.path.normpath(path)


def _queue(flavor: str, settings: dict, cfg: dict) -> str:
    queue = (settings.get("q") or "").split("@")[0] or cfg["queues"][0]
    if queue not in cfg["queues"]:
        if flavor == "torque":
            raise CommandError(
                "qsub: submit error (Unknown queue MSG=requested queue not found)", 172
            )
        raise CommandError("qsub: Unknown queue", 170)
    return queue


def _validate_name(flavor: str, name: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][!-~]*", name) or len(name) > 236:
        raise CommandError(f"qsub: illegal -N value\n{USAGE[flavor]}", 2)


def qsub_main(flavor: str, argv: list[str]) -> int:
    if argv == ["--version"]:
        sys.stdout.write(VERSION[flavor])
        return 0
    try:
        sim, job_id = submit(flavor, argv)
    except CommandError as error:
        return fail(error)
    if take_lost_reply(sim.dir):  # queued at the commit; its reply lost
        ensure_supervisor(sim)
        return fail(CommandError(LOST_REPLY[flavor], 1))
    sys.stdout.write(job_id + "\n")
    sys.stdout.flush()
    ensure_supervisor(sim)
    return 0


def submit(flavor: str, argv: list[str]) -> tuple[Sim, str]:
    pairs, operands, executable = parse_options(flavor, argv)
    settings = _collect(pairs)
    text, script_path = ("", None) if executable is not None else _read_script(flavor, operands)
    prefix = settings.get("C", os.environ.get("PBS_DPREFIX", "#PBS"))
    directive_pairs: list = []
    if prefix:
        for words in scan_directives(text, prefix):
            found, extra, _ = parse_options(flavor, words)
            if extra:
                raise CommandError(f"qsub: directive error: {' '.join(words)}", 1)
            directive_pairs.extend(found)
    settings = _collect(directive_pairs + pairs)
    indices = None
    if flavor == "pbspro" and settings.get("J"):
        indices = pbs_arrays.parse_range(str(settings["J"]), USAGE[flavor])
    if flavor == "torque" and settings.get("t"):
        indices = torque_arrays.parse_request(str(settings["t"]))
    user = invoking_user()
    cwd = os.getcwd()
    resources = pbs_resources.merge(flavor, settings["l"])
    request = (
        pbs_resources.pbspro_request(resources)
        if flavor == "pbspro"
        else pbs_resources.torque_request(resources)
    )
    if executable is not None:
        name = "STDIN"
    else:
        name = os.path.basename(script_path) if script_path else "STDIN"
    name = settings.get("N") or name
    _validate_name(flavor, name)
    sim = Sim(flavor)
    with sim.writing() as data:
        cfg = data["config"]
        queue = _queue(flavor, settings, cfg)
        seq = allocate_id(data)
        full = f"{seq}[].{cfg['server']}" if indices is not None else f"{seq}.{cfg['server']}"
        job = new_job(
            flavor,
            seq,
            user,
            name=name,
            queue=queue,
            ncpus=request["ncpus"],
            ngpus=request["ngpus"],
            mem_mb=request["mem_mb"],
            walltime=request["walltime"],
            account=settings.get("A"),
            project=settings.get("P"),
            submit_cwd=cwd,
            workdir=_workdir(flavor, settings, user, cwd),
            join=_join(settings),
            stdout=_output_path(settings.get("o"), f"{name}.o{seq}", "OU", full, cwd),
            stderr=_output_path(settings.get("e"), f"{name}.e{seq}", "ER", full, cwd),
            append=False,
            held=bool(settings.get("h")),
        )
        hosts = pbs_resources.hosts_wanted(flavor, resources, request)
        limit = beyond_host(job, cfg) or hosts > len(host_names(cfg))
        if limit:
            if flavor == "torque":
                raise CommandError(
                    "qsub: submit error (Job exceeds queue resource limits "
                    "MSG=cannot locate feasible nodes (nodes file is empty, all "
                    "systems are busy, or no nodes have the requested feature))",
                    190,
                )
            raise CommandError("qsub: Job violates queue and/or server resource limits", 188)
        if indices is not None and flavor == "torque":
            torque_arrays.check_size(indices, cfg)
        elif indices is not None and len(indices) > cfg["max_array_size"]:
            raise CommandError(*pbs_arrays.MAX_ARRAY_SIZE)
        variables = _variables(settings, queue, cwd, user)
        job["native"] = {
            "resource_list": request["resource_list"],
            "mpiprocs": request.get("mpiprocs", 1),
            "hosts": hosts,
            "nodes": request.get("nodes", 1),
            "ppn": request.get("ppn", 1),
            "submit_args": shlex.join(argv),
            "priority": int(settings.get("p") or 0),
            "rerunable": settings.get("r", "y") != "n",
            "other": settings["W"],
            "keep": settings.get("k", "n"),
            "mail": settings.get("m", "a"),
            "array_indices": settings.get("J" if flavor == "pbspro" else "t"),
        }
        if indices is not None:
            how = (executable, text, settings, user, variables)
            return sim, _submit_array(sim, data, job, indices, how)
        job["argv"] = _job_argv(sim.job_dir(seq), executable, text, settings, user)
        _store_files(
            sim.job_dir(seq),
            text if executable is None else None,
            _base_env(user, variables),
            variables,
        )
        data["jobs"][str(seq)] = job
    return sim, full


def _submit_array(sim: Sim, data: dict, job: dict, indices: list[int], how: tuple) -> str:
    """An array job (qsub -J, Torque's qsub -t): one record per subjob, each with its own
    folder; the array's own record is built from them (pbs_arrays, torque_arrays). Output
    paths: `^array_index^` becomes the subjob's index, and the default names end in
    `.^array_index^` (OpenPBS svr_jobfunc.c prefix_std_file, array_func.c); Torque appends
    "-<index>" to the name and both paths (job_clone)."""
    executable, text, settings, user, variables = how
    script = text if executable is None else None
    torque = job["flavor"] == "torque"
    for index in indices:
        element = array_element(data, job, index)
        if torque:
            torque_arrays.subjob_fields(element, index)
        for stream, flag in () if torque else (("stdout", "o"), ("stderr", "e")):
            path = element[stream].replace("^array_index^", str(index))
            element[stream] = path if settings.get(flag) else f"{path}.{index}"
        # Torque's job_clone adds PBS_ARRAYID to the subjob's Variable_List.
        own = {**variables, "PBS_ARRAYID": str(index)} if torque else variables
        folder = sim.job_dir(element["id"])
        element["argv"] = _job_argv(folder, executable, text, settings, user)
        _store_files(folder, script, _base_env(user, own), own)
        data["jobs"][str(element["id"])] = element
    return f"{job['id']}[].{data['config']['server']}"


def _workdir(flavor: str, settings: dict, user: dict, cwd: str) -> str:
    if flavor == "torque" and (settings.get("d") or settings.get("w")):
        return os.path.join(cwd, settings.get("d") or settings.get("w"))
    return user["home"]


def _join(settings: dict) -> str | None:
    join = settings.get("j")
    return join if join in ("oe", "eo") else None


def _job_argv(
    job_dir: str, executable: list | None, text: str, settings: dict, user: dict
) -> list[str]:
    if executable is not None:
        if not executable:
            raise CommandError("qsub: no executable given after --", 2)
        return list(executable)
    script = os.path.join(job_dir, "script")
    if settings.get("S"):
        return [settings["S"].split(",")[0].split("@")[0], script]
    if text.startswith("#!"):
        return [script]
    return [user["shell"] or "/bin/sh", script]


def _base_env(user: dict, variables: dict) -> dict:
    """What a PBS job starts with: the owner's login basics, then Variable_List."""
    env = {
        "HOME": user["home"],
        "LOGNAME": user["name"],
        "USER": user["name"],
        "SHELL": user["shell"],
        "PATH": "/bin:/usr/bin",
        "MAIL": f"/var/mail/{user['name']}",
    }
    env.update(variables)
    return env


def _store_files(job_dir: str, script: str | None, env: dict, variables: dict) -> None:
    os.makedirs(job_dir, exist_ok=True)
    os.chmod(job_dir, 0o777)
    if script is not None:
        path = os.path.join(job_dir, "script")
        with open(path, "w") as handle:
            handle.write(script)
        os.chmod(path, 0o755)
    for name, content in (("env.json", env), ("variables.json", variables)):
        path = os.path.join(job_dir, name)
        with open(path, "w") as handle:
            json.dump(content, handle)
        os.chmod(path, 0o666)
