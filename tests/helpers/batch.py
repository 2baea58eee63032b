"""Batch pools for integration tests: estates, login-node folders that put a scheduler (the
simulators, or Slurm behind a counting wrapper) first on PATH, and an sshd that serves them."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import free_port, wait_for

from helpers.estates import estate_yaml

ROOT = Path(__file__).resolve().parents[2]
FAKES = ROOT / "tests" / "fakes"
JOB_PYTHON = "/usr/bin/python3"  # the test accounts cannot read the virtual environment's
PROGRAMS = {
    "slurm": ("sbatch", "squeue", "scancel"),
    "pbspro": ("qsub", "qstat", "qdel", "qrerun"),
    "torque": ("qsub", "qstat", "qdel"),
    "lsf": ("bsub", "bjobs", "bkill", "brequeue"),
}
STATUS_PROGRAM = {"slurm": "squeue", "pbspro": "qstat", "torque": "qstat", "lsf": "bjobs"}
KIND = {"slurm": "slurm", "pbspro": "pbs", "torque": "pbs", "lsf": "lsf"}
# Simulator settings for quick tests: short kill delays, an LSF minute (bsub -W) of 3 s and
# LSF's grace after the run-limit warning shortened from ten minutes to 3 s. Every other
# server setting keeps the vendor's default unless a test names it.
SIM_SETTINGS = {
    "KLIQUE_SIM_KILL_DELAY": "1",
    "KLIQUE_SIM_LSF_MINUTE": "3",
    "KLIQUE_SIM_LSF_RUNLIMIT_GRACE": "3",
}


def shared_folder(prefix: str) -> Path:
    """A folder the test accounts can reach (pytest's own are private to root)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    folder.chmod(0o755)
    return folder


def open_folder(path: Path) -> Path:
    """A folder every account may write, sticky like /tmp."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o1777)
    return path


def login_node(
    folder: Path,
    scheduler: str,
    sim_dir: Path | None,
    count_file: Path | None = None,
    settings: Mapping[str, str] | None = None,
) -> Path:
    """A bin folder with the scheduler's commands: simulators bound to `sim_dir` (with the
    server `settings` named, the vendor's defaults otherwise), or the real Slurm ones; with
    `count_file`, each status command first appends its arguments there."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    bin_dir.chmod(0o755)
    if count_file is not None:  # the status command runs as the pool's accounts
        count_file.touch()
        count_file.chmod(0o666)
    for program in PROGRAMS[scheduler]:
        if scheduler == "slurm":
            target = shutil.which(program, path="/usr/bin:/usr/local/bin")
            assert target, f"{program} is not installed"
        else:
            target = str(FAKES / scheduler / program)
        lines = ["#!/bin/sh"]
        if sim_dir is not None:
            named = {"KLIQUE_SIM_DIR": str(sim_dir), **SIM_SETTINGS, **(settings or {})}
            lines += [f"export {k}='{v}'" for k, v in named.items()]
        if count_file is not None and program == STATUS_PROGRAM[scheduler]:
            lines.append(f"echo \"$*\" >>'{count_file}'")
        lines.append(f"exec '{target}' \"$@\"")
        path = bin_dir / program
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o755)
    return bin_dir


def search_path(bin_dir: Path) -> str:
    return f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"


def transport_settings(endpoint: SSHLogin | None) -> dict[str, Any]:
    """A pool's transport: local, or SSH to the login node `endpoint`."""
    if endpoint is None:
        return {"kind": "local"}
    return {
        "kind": "ssh",
        "host": "127.0.0.1",
        "port": endpoint.port,
        "known_hosts": str(endpoint.known_hosts),
        "client_keys": [str(endpoint.client_key)],
    }


def batch_pool(
    scheduler: str, job_root: Path, endpoint: SSHLogin | None, **extra: Any
) -> dict[str, Any]:
    """The settings of one pool of the scheduler, as the estate file writes them."""
    settings: dict[str, Any] = {
        "kind": KIND[scheduler],
        "job_root": str(job_root),
        "python": JOB_PYTHON,
        "poll_interval": "1s",
        "lost_after": "30s",
        "user_map": {"alice": "alice", "bob": "bob"},
    }
    if scheduler == "slurm":
        settings.update(partition="debug", accounting="jobcomp")
    if scheduler == "torque":
        settings["dialect"] = "torque"
    return {**settings, **extra, "transport": transport_settings(endpoint)}


def pool_yaml(scheduler: str, job_root: Path, endpoint: SSHLogin | None, **extra: Any) -> str:
    """One pool named `batch` of the scheduler, as the lines of an estate file's pools section."""
    pools = {"batch": batch_pool(scheduler, job_root, endpoint, **extra)}
    return estate_yaml(pools=pools).removeprefix("pools:\n")


@dataclass(frozen=True)
class SSHLogin:
    """Where an SSH transport logs in to reach a scheduler's commands."""

    port: int
    known_hosts: Path
    client_key: Path


@contextmanager
def sshd_serving(folder: Path, shared: Any, path: str) -> Iterator[SSHLogin]:
    """An sshd on loopback with the shared test sshd's keys, whose sessions get PATH=`path`
    (as a login node's profile would put the scheduler's commands there)."""
    keys = Path(shared.known_hosts).parent
    port = free_port()
    config = folder / "sshd_config"
    config.write_text(
        "\n".join(
            [
                "ListenAddress 127.0.0.1",
                f"Port {port}",
                f"HostKey {keys / 'host_ed25519_key'}",
                f"PidFile {folder / 'sshd.pid'}",
                f"AuthorizedKeysFile {keys / 'authorized_keys'}/%u",
                "StrictModes no",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin no",
                "UsePAM no",
                "MaxSessions 64",
                "MaxStartups 64:30:128",
                f"SetEnv PATH={path}",
                "",
            ]
        )
    )
    public_key = (keys / "host_ed25519_key.pub").read_text().split()[:2]
    known_hosts = folder / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {' '.join(public_key)}\n")
    log = (folder / "sshd.log").open("ab")
    process = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT
    )

    def listening() -> bool:
        assert process.poll() is None, (folder / "sshd.log").read_text()
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(listening, 30, f"sshd on port {port}")
        yield SSHLogin(port, known_hosts, Path(shared.client_key))
    finally:
        process.terminate()
        process.wait(10)
        log.close()


def run_as(account: str, argv: list[str], path: str) -> subprocess.CompletedProcess[str]:
    """argv as a test account with the login node's PATH (what the pool's commands see)."""
    return subprocess.run(
        ["runuser", "-u", account, "--", "env", f"PATH={path}", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def count_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def remove_tree(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def sticky_job_root(prefix: str) -> Iterator[Path]:
    """A job root every account may write (sticky, like /tmp) in a folder of its own, removed
    after."""
    folder = shared_folder(prefix)
    try:
        yield open_folder(folder / "jobs")
    finally:
        remove_tree(folder)


def start_now(env: dict[str, str], job: str) -> None:
    """An operator's start-now on a requeued job, once Slurm lists it PENDING and its old run
    has left the node. While the old run still ends (COMPLETING), the requeue's own BeginTime,
    set when that ends, would overwrite it. And slurmd refuses a launch whose credential is no
    newer, to the second, than the revocation of the old run's ("Killing non-startable batch
    job: Job credential revoked"): Slurm's own hold after a requeue is there for that, so the
    start is set two seconds on, once slurmd lists no process of the old run."""

    def pending() -> bool:
        listed = ["squeue", "--noheader", f"--jobs={job}", "--format=%T"]
        done = subprocess.run(listed, capture_output=True, text=True, check=False, env=env)
        return done.stdout.strip() == "PENDING"

    def old_run_gone() -> bool:  # the node's slurmd lists no process of the job
        steps = ["scontrol", "listpids", job]
        return subprocess.run(steps, capture_output=True, check=False, env=env).returncode != 0

    wait_for(pending, 120, f"job {job} to be pending in Slurm")
    wait_for(old_run_gone, 120, f"the old run of job {job} to leave the node", interval=0.2)
    update = ["scontrol", "update", f"jobid={job}", "StartTime=now+2"]
    subprocess.run(update, check=True, env=env)


def looked_for(driver: Any, tasks: list[Any], task: Any, timeout: float = 60.0) -> Any:
    """The pool's observation of `task`, placed by a submission whose outcome is unknown: the
    first look that finds its job, or the second of two looks, the pool's message timeout
    apart, that both miss it (broker/pools/batch.py, `_missed`)."""
    return wait_for(
        lambda: asyncio.run(driver.poll(tasks)).get(task.id), timeout, f"task {task.id}", 0.2
    )
