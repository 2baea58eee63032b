"""A task on several nodes: which rank this runner is, and what the task is told of its place.

The batch script starts one runner per node (Slurm `srun`, PBS `pbsdsh`, LSF `blaunch`); each
finds its rank in what the scheduler's launcher set, and tells the task the way distributed
training expects it (the variables torchrun reads): RANK, WORLD_SIZE, LOCAL_RANK, NODE_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, plus KLIQUE_NODES (the node list, comma-separated).
"""

from __future__ import annotations

import hashlib
import re

from inside_job.errors import SetupFailed

# MASTER_PORT: from the job id, in 20000-29999: unprivileged, and below Linux's default
# ephemeral range (32768-60999, net.ipv4.ip_local_port_range), so no outgoing connection holds it.
PORT_BASE = 20000
PORT_SPAN = 10000


class Place:
    """One runner's place among the task's nodes."""

    def __init__(self, rank: int, world: int, nodes: list[str], job_id: str, master: str) -> None:
        self.rank = rank
        self.world = world
        self.nodes = nodes
        self.job_id = job_id
        self.master = master  # the first node's address

    def env(self) -> dict[str, str]:
        """What the task is told (one runner per node: the local rank is 0)."""
        return {
            "RANK": str(self.rank),
            "NODE_RANK": str(self.rank),
            "WORLD_SIZE": str(self.world),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": self.master,
            "MASTER_PORT": str(master_port(self.job_id)),
            "KLIQUE_NODES": ",".join(self.nodes),
        }


def master_port(job_id: str) -> int:
    """The same port for every rank of a job, different for neighbouring job ids."""
    digits = job_id.split(".", 1)[0]
    if digits.isdigit():
        number = int(digits)
    else:
        number = int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:4], "big")
    return PORT_BASE + number % PORT_SPAN


def find(environ: dict[str, str]) -> Place:
    """This runner's place, from the variables the scheduler's launcher set."""
    if "SLURM_PROCID" in environ:
        return _slurm(environ)
    if "PBS_NODENUM" in environ:
        return _pbs(environ)
    if "LSF_PM_TASKID" in environ:
        return _lsf(environ)
    raise SetupFailed(
        "the task asks for several nodes, but this runner was not started by srun, pbsdsh or "
        "blaunch (no SLURM_PROCID, PBS_NODENUM or LSF_PM_TASKID): the batch template must "
        "start one runner per node with --node (see templates/README.md)"
    )


def _slurm(environ: dict[str, str]) -> Place:
    """srun(1), "OUTPUT ENVIRONMENT VARIABLES": SLURM_PROCID (the task's rank), SLURM_NTASKS,
    SLURM_JOB_NODELIST (a hostlist), SLURM_LAUNCH_NODE_IPADDR (where srun runs: the batch
    script's node, which is the allocation's first, sbatch(1))."""
    nodes = expand_hostlist(environ.get("SLURM_JOB_NODELIST", ""))
    master = environ.get("SLURM_LAUNCH_NODE_IPADDR") or (nodes[0] if nodes else "")
    return Place(
        _int(environ, "SLURM_PROCID"),
        _int(environ, "SLURM_NTASKS"),
        nodes,
        environ.get("SLURM_JOB_ID", ""),
        master,
    )


def _pbs(environ: dict[str, str]) -> Place:
    """pbsdsh(1B) sets PBS_TASKNUM, PBS_NODENUM and PBS_VNODENUM: PBS_NODENUM is the node
    this copy runs on, counted from 0 in the order of the job's hosts, which PBS_NODEFILE lists
    (a host once per MPI process: the nodes are its distinct lines, in order)."""
    nodes = _distinct(_read_lines(environ.get("PBS_NODEFILE", "")))
    return Place(
        _int(environ, "PBS_NODENUM"),
        len(nodes),
        nodes,
        environ.get("PBS_JOBID", ""),
        nodes[0] if nodes else "",
    )


def _lsf(environ: dict[str, str]) -> Place:
    """blaunch(1) -z HOSTS: one task on each host named, LSF_PM_TASKID counting them from 1;
    LSB_MCPU_HOSTS lists the job's hosts with their slots (LSB_HOSTS: once per slot), the
    first running the batch script."""
    pairs = environ.get("LSB_MCPU_HOSTS", "").split()  # host slots host slots ...
    nodes = _distinct(pairs[::2] if pairs else environ.get("LSB_HOSTS", "").split())
    return Place(
        _int(environ, "LSF_PM_TASKID") - 1,
        len(nodes),
        nodes,
        environ.get("LSB_JOBID", ""),
        nodes[0] if nodes else "",
    )


def expand_hostlist(text: str) -> list[str]:
    """Slurm's hostlist syntax: `n[1-3,7],gpu05` -> n1 n2 n3 n7 gpu05 (zero padding kept)."""
    names: list[str] = []
    for prefix, ranges, suffix in re.findall(r"([^,\[]*)(?:\[([^\]]*)\])?([^,\[]*),?", text):
        if not ranges:
            if prefix + suffix:
                names.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            width = len(low)
            for n in range(int(low), int(high or low) + 1):
                names.append(f"{prefix}{n:0{width}d}{suffix}")
    return names


def _distinct(hosts: list[str]) -> list[str]:
    return list(dict.fromkeys(hosts))


def _int(environ: dict[str, str], name: str) -> int:
    value = environ.get(name, "")
    if not value.isdigit():
        raise SetupFailed(f"{name}={value!r} is not a number: the launcher set no rank")
    return int(value)


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip()]
    except OSError as exc:
        raise SetupFailed(f"cannot read PBS_NODEFILE {path!r}: {exc.strerror}") from exc
