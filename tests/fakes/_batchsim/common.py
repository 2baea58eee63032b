"""Small helpers shared by the simulated commands: users, hosts, units, time formats."""

from __future__ import annotations

import fcntl
import grp
import os
import pwd
import re
import shlex
import sys
import time


class CommandError(Exception):
    """A refusal a real command reports: the text for stderr and its exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def fail(error: CommandError) -> int:
    sys.stderr.write(error.message if error.message.endswith("\n") else error.message + "\n")
    return error.status


def short_host() -> str:
    return os.environ.get("KLIQUE_SIM_HOST") or os.uname().nodename.split(".")[0]


def invoking_user() -> dict:
    uid, gid = os.getuid(), os.getgid()
    try:
        entry = pwd.getpwuid(uid)
        name, home, shell = entry.pw_name, entry.pw_dir, entry.pw_shell or "/bin/sh"
    except KeyError:
        name, home, shell = str(uid), "/", "/bin/sh"
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:
        group = str(gid)
    return {"name": name, "uid": uid, "gid": gid, "group": group, "home": home, "shell": shell}


def parse_duration(text: str) -> int:
    """[[HH:]MM:]SS as PBS writes walltime (pbs_resources(7B), 'duration')."""
    parts = text.strip().split(":")
    if not 1 <= len(parts) <= 3 or not all(re.fullmatch(r"\d+(\.\d+)?", p) for p in parts):
        raise ValueError(text)
    seconds = 0.0
    for part in parts:
        seconds = seconds * 60 + float(part)
    return int(seconds)


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}


def parse_size(text: str, default_unit: str = "b") -> int:
    """A size such as 8gb, 512mb, 1024kb or 4096 (pbs_resources(7B), 'size'); bytes."""
    match = re.fullmatch(r"(\d+)\s*([kmgtp]?)(b|w)?", text.strip().lower())
    if not match:
        raise ValueError(text)
    number, prefix, word = match.groups()
    if not prefix and not word:
        prefix = default_unit.lower().rstrip("b")
    factor = _UNITS[prefix] * (8 if word == "w" else 1)
    return int(number) * factor


def mb_ceil(size_bytes: int) -> int:
    return -(-size_bytes // (1024 * 1024))


def ctime(stamp: float | None) -> str:
    """ctime(3) without the newline, as PBS prints ctime/qtime/stime/mtime."""
    return time.ctime(stamp) if stamp else ""


def lsf_time(stamp: float | None, suffix: str = "") -> str:
    """'Nov 29 20:51' as bjobs -o prints submit_time/start_time/finish_time."""
    if not stamp:
        return ""
    text = time.strftime("%b %e %H:%M", time.localtime(stamp))
    return f"{text} {suffix}" if suffix else text


def scan_directives(script_text: str, prefix: str) -> list[list[str]]:
    """Option words from '#PBS'/'#BSUB' lines before the first command line of a script.

    qsub(1B): directives must precede the first executable line; blank lines and
    comments may come between them. bsub reads '#BSUB' lines the same way.
    """
    found = []
    for number, line in enumerate(script_text.splitlines()):
        stripped = line.strip()
        if number == 0 and stripped.startswith("#!"):
            continue
        if not stripped:
            continue
        if stripped.startswith(prefix) and (
            len(stripped) == len(prefix) or stripped[len(prefix)].isspace()
        ):
            body = stripped[len(prefix) :].split(" #", 1)[0]
            try:
                found.append(shlex.split(body))
            except ValueError:
                found.append(body.split())
            continue
        if stripped.startswith("#"):
            continue
        break
    return found


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return int(value)


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return float(value)


def short_options(args: list[str], spec: str, permute: bool = True) -> tuple[list, list[str]]:
    """getopt(3) for single-letter options; spec as in getopt ("f" flag, "u:" with value).

    GNU getopt permutes: options may follow operands unless permute is False.
    """
    takes = {c: i + 1 < len(spec) and spec[i + 1] == ":" for i, c in enumerate(spec) if c != ":"}
    opts: list[tuple[str, str]] = []
    operands: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            operands.extend(args[i + 1 :])
            break
        if not arg.startswith("-") or arg == "-":
            if not permute:
                operands.extend(args[i:])
                break
            operands.append(arg)
            i += 1
            continue
        j = 1
        while j < len(arg):
            letter = arg[j]
            if letter not in takes:
                raise CommandError(f"invalid option -- '{letter}'", 2)
            if takes[letter]:
                value = arg[j + 1 :]
                if not value:
                    i += 1
                    if i >= len(args):
                        raise CommandError(f"option requires an argument -- '{letter}'", 2)
                    value = args[i]
                opts.append((f"-{letter}", value))
                break
            opts.append((f"-{letter}", ""))
            j += 1
        i += 1
    return opts, operands


# The chaos switch that loses a submit command's reply: a count in `lose-replies` of the
# scheduler's state folder. While it is above 0, each submission is accepted (the job is
# queued as usual) and the command then reports the communication error its real
# counterpart prints when the server's reply never reaches it, and fails; each takes one off.
LOST_REPLY = {
    # OpenPBS src/cmds/qsub.c: a failed pbs_submit with no server message prints the error
    # number; PBSE_PROTOCOL (15031, src/include/pbs_error.h) is a reply that could not be read.
    "pbspro": "qsub: Error (15031) submitting job",
    # TORQUE src/cmds/qsub_functions.c: "qsub: submit error (%s)" with the DIS decoding
    # error's text (src/lib/Libdis dis_emsg[DIS_EOF], "End of File").
    "torque": "qsub: submit error (End of File)",
    # bsub: lsb_sysmsg() then "Job not submitted." for any lsb_submit failure; LSBE_LSLIB with
    # LSE_MSG_SYS (lsberrno.h, lserrno.h) when the reply's read fails.
    "lsf": "Failed in an LSF library call: Failed in sending/receiving a message: "
    "Connection reset by peer. Job not submitted.",
}


def take_lost_reply(sim_dir: str) -> bool:
    """Whether this submission's reply is to be lost (the switch above), taking one off."""
    path = os.path.join(sim_dir, "lose-replies")
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    with os.fdopen(fd, "r+") as switch:
        fcntl.flock(switch, fcntl.LOCK_EX)
        left = int(switch.read().strip() or 0)
        if left <= 0:
            return False
        switch.seek(0)
        switch.truncate()
        switch.write(str(left - 1))
        return True
