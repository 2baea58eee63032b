"""A hung cluster beside healthy pools, for the pool-isolation test and benchmark: the real
Slurm cluster reached through a login node whose scheduler commands hang while a flag file
exists (as a slurmctld that stopped answering, or a wedged filesystem, makes them hang)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.batch import JOB_PYTHON, open_folder, remove_tree, shared_folder, sshd_serving

PROGRAMS = ("sbatch", "squeue", "scancel", "sinfo", "sacct")


@dataclass
class Estate:
    text: str
    hang: Path  # while this file exists, the hung pool's commands do not answer
    job_roots: list[Path]


def hanging_login_node(folder: Path, flag: Path) -> Path:
    """A bin folder whose Slurm commands wait while `flag` exists, then run the real ones."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    bin_dir.chmod(0o755)
    for program in PROGRAMS:
        target = shutil.which(program, path="/usr/bin:/usr/local/bin")
        assert target, f"{program} is not installed"
        wrapper = bin_dir / program
        wrapper.write_text(
            f"#!/bin/sh\nwhile [ -e '{flag}' ]; do sleep 0.2; done\nexec '{target}' \"$@\"\n"
        )
        wrapper.chmod(0o755)
    return bin_dir


def slurm_pool(name: str, job_root: Path, transport: str) -> str:
    return f"""
  {name}:
    kind: slurm
    partition: debug
    job_root: {job_root}
    python: {JOB_PYTHON}
    poll_interval: 1s
    lost_after: 60s
    accounting: jobcomp
    transport: {transport}
    user_map: {{alice: alice, bob: bob}}
"""


@contextmanager
def estate_with_a_hung_pool(cluster: Any, shared_sshd: Any, hung: bool) -> Iterator[Estate]:
    """Resources `fast` (Slurm), `local` (host) and, when `hung`, `stuck` on the same cluster
    behind the hanging login node over SSH."""
    folder = shared_folder("klique-isolation-")
    flag = folder / "hang"
    roots = [open_folder(cluster.work / f"{folder.name}-{n}") for n in ("ok", "hung", "host")]
    resources = """
resources:
  fast:
    profile: {cpus: 1, memory: 100M, walltime: 10m, pools: [slurm-ok]}
  local:
    profile: {cpus: 1, memory: 100M, walltime: 10m, pools: [host]}
"""
    pools = "pools:" + slurm_pool("slurm-ok", roots[0], "{kind: local}")
    pools += f"""
  host:
    kind: host
    slots: 4
    job_root: {roots[2]}
    user_map: {{alice: alice, bob: bob}}
"""
    with ExitStack() as stack:
        if hung:
            path = f"{hanging_login_node(folder, flag)}:/usr/bin:/bin"
            login = stack.enter_context(sshd_serving(folder, shared_sshd, path))
            transport = (
                f"{{kind: ssh, host: 127.0.0.1, port: {login.port}, "
                f"known_hosts: {login.known_hosts}, client_keys: [{login.client_key}]}}"
            )
            resources += (
                "  stuck:\n"
                "    profile: {cpus: 1, memory: 100M, walltime: 10m, pools: [slurm-hung]}\n"
            )
            pools += slurm_pool("slurm-hung", roots[1], transport)
        try:
            yield Estate(resources + pools, flag, roots)
        finally:
            flag.unlink(missing_ok=True)
            for root in roots:
                remove_tree(root)
    remove_tree(folder)
