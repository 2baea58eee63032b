"""pbsdsh and blaunch: one process per node of a running job, each told where it runs.

The simulated hosts are all this machine, so a "remote" task is a child process with the
variables the real launcher gives it; the execution host's kill of the job's session reaches
them too (they stay in it).

pbsdsh  PBS Professional Reference Guide and TORQUE 6.1 pbsdsh(1B): "pbsdsh [-c copies]
        [-n node] [-s] [-u] [-v] [-o] [--] program [args]"; without -c or -n the program is
        spawned on every node allocated to the job (one per line of PBS_NODEFILE), with -u
        once per host; "PBS_TASKNUM, PBS_NODENUM, and PBS_VNODENUM ... contain the TM task
        id, the node identifier, and the cpu (virtual node) identifier". Outside a job:
        "pbsdsh: error from tm_init() ... " and exit 1 (tm_init finds no job).
blaunch IBM Spectrum LSF 10.1 Command Reference, blaunch: "blaunch [-n] [-u host_file |
        -z host_name ... | host_name] command [argument ...]"; "When no host names are
        specified, LSF runs tasks on all allocated hosts, one remote task per job slot";
        -z takes the hosts as one space-delimited word ("-z 'h1 h2'"); each task gets
        LSF_PM_TASKID (counted from 1) and the job's LSB_* variables; it
        "can be used only to launch tasks on remote hosts that are part of a job
        allocation": a host outside it is refused.
"""

from __future__ import annotations

import os
import subprocess
import sys


def _run_all(argv: list[str], envs: list[dict[str, str]], name: str) -> int:
    """Start every task at once, wait for them all; the first non-zero status is returned."""
    procs = []
    for env in envs:
        try:
            procs.append(subprocess.Popen(argv, env=env))
        except OSError as exc:
            sys.stderr.write(f"{name}: {argv[0]}: {exc.strerror}\n")
            return 1
    codes = [proc.wait() for proc in procs]
    return next((c if c > 0 else 128 - c for c in codes if c != 0), 0)


def pbsdsh_main(argv: list[str]) -> int:
    unique = False
    copies: int | None = None
    node: int | None = None
    args = list(argv)
    while args and args[0].startswith("-"):
        flag = args.pop(0)
        if flag == "--":
            break
        if flag == "-u":
            unique = True
        elif flag == "-c" and args:
            copies = int(args.pop(0))
        elif flag == "-n" and args:
            node = int(args.pop(0))
        elif flag not in ("-s", "-v", "-o"):
            sys.stderr.write(f"pbsdsh: invalid option -- '{flag.lstrip('-')}'\n")
            return 1
    nodefile = os.environ.get("PBS_NODEFILE")
    if not args or not nodefile:
        sys.stderr.write("pbsdsh: error from tm_init() (not in a PBS job)\n" if args else "")
        sys.stderr.write("" if args else "usage: pbsdsh [-c copies] [-s] [-v] [-o] -- program\n")
        return 1
    with open(nodefile) as handle:
        lines = [line.strip() for line in handle if line.strip()]
    hosts = list(dict.fromkeys(lines))
    vnodes = list(range(len(lines)))
    if unique:
        vnodes = [lines.index(host) for host in hosts]
    if node is not None:
        vnodes = [node]
    elif copies is not None:
        vnodes = vnodes[:copies]
    envs = [
        {
            **os.environ,
            "PBS_TASKNUM": str(2 + i),  # the job's shell is task 1
            "PBS_NODENUM": str(hosts.index(lines[v])),
            "PBS_VNODENUM": str(v),
        }
        for i, v in enumerate(vnodes)
    ]
    return _run_all(args, envs, "pbsdsh")


def blaunch_main(argv: list[str]) -> int:
    args = list(argv)
    named: list[str] | None = None
    if args[:1] == ["-z"] and len(args) > 1:  # one word: the hosts, space-delimited
        args.pop(0)
        named = args.pop(0).split()
    elif len(args) > 1 and not args[0].startswith("-") and "/" not in args[0]:
        named = [args.pop(0)]  # blaunch host_name command, as rsh
    slots = os.environ.get("LSB_HOSTS", "").split()
    if not os.environ.get("LSB_JOBID") or not slots:
        sys.stderr.write("blaunch: not running in a job allocation (no LSB_JOBID)\n")
        return 1
    if not args:
        sys.stderr.write("Usage: blaunch [-n] [-u host_file | -z host_name ... | host_name] cmd\n")
        return 1
    hosts = slots if named is None else named
    strangers = [host for host in hosts if host not in slots]
    if strangers:
        sys.stderr.write(f"blaunch: {strangers[0]} is not a host of this job's allocation\n")
        return 1
    envs = [{**os.environ, "LSF_PM_TASKID": str(i + 1)} for i in range(len(hosts))]
    return _run_all(args, envs, "blaunch")
