"""The host pool: tasks run through the runner as processes on this machine, in fixed slots.

Each task runs as its owner's mapped Linux account. A host pool without a user map is a
single-user pool: it runs only the tasks of the account that runs the server (never root).
Placement counts the host's slots and GPUs and picks the GPU ids (Task.gpu_ids); this driver
makes the job folder and starts the runner as the account, reads the files the runner writes
as the account (one command per account per cycle) and signals it as the account.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import time
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from broker.domain import Pool, Task, TaskState
from broker.errors import KliqueError, NotPermitted, SubmitError
from broker.execution import Observation, PoolState, Submission
from broker.pools.base import Context, PoolDriver, observation_from_exit, own_uv, parse_json
from broker.pools.docker_args import CDI_KIND, check_image, check_run_arg
from broker.pools.registry import PoolKindSpec
from broker.pools.settings import PoolSettings, settings_as
from broker.transport import LocalTransport
from broker.units import Seconds, SizeMB

# A runner's environment: this allow-list, never the server's own (database URLs, tokens).
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
# The trust store's overrides pass too: a runner reports to the server's public URL, which a
# site may serve with its own CA's certificate (nginx in front, deploy/nginx/klique.conf).
_PASSED = ("LANG", "LC_ALL", "TZ", "SSL_CERT_FILE", "SSL_CERT_DIR")
_KILL_GRACE_S = 10.0
# An exit file while the runner's process still lives is believed for this long: a real runner
# exits right after writing it. Past this, it is a false report and the task keeps running.
CLAIM_GRACE_S = 5.0
_NOT_STARTED = (126, 127)  # runuser's and sh's exit when the interpreter cannot be run


class HostSettings(PoolSettings):
    """This machine: tasks run as processes in fixed slots (docs/host-pools.md)."""

    kind: Literal["host"]
    """Says the pool is this machine."""
    slots: int = Field(1, ge=1)
    """Tasks at once."""
    gpus: int = Field(0, ge=0)
    """GPUs on the host that the pool hands out, ids 0..gpus-1 (or those of `gpu_ids`)."""
    gpu_ids: list[int] | None = Field(None, min_length=1, max_length=1024)
    """The host's ids of the pool's GPUs, as nvidia-smi -L numbers them, when pools split one
    host's GPUs between them."""
    gpu_memory: SizeMB = 0
    """The memory of one GPU, for requests sized by GPU memory."""
    # docker: each task's runner runs in its image, in a container (broker/pools/host_docker.py)
    mode: Literal["venv", "docker"] = "venv"
    """`venv`: each task's runner is a process of its account; `docker`: it runs in the task's
    image, in a container capped at its compute resource's cpus and memory."""
    runtime: Literal["podman", "docker"] = "podman"
    """Docker mode: the container runtime the server runs."""
    run_args: list[str] = []
    """Docker mode: options added to `run`, each `--OPTION=VALUE` (ulimit, runtime, network,
    pids-limit, shm-size); cpus and memory come from each task's profile."""
    gpu_device: str = "nvidia.com/gpu"
    """Docker mode with podman: the GPUs' CDI device kind."""
    stop_grace: Seconds = 10
    """Docker mode: from SIGTERM to SIGKILL when a task's container is stopped."""
    image: str | None = None
    """Docker mode: the image of tasks that name none (a registry reference)."""
    rootless: bool | None = None
    """Docker mode with podman: whether podman runs rootless (then `--userns=keep-id`); unset:
    as `podman info` says."""
    selinux_relabel: bool | None = None
    """Docker mode: relabel the bind mounts for SELinux (`:Z`, `:z`); unset: where
    /sys/fs/selinux/enforce says SELinux enforces."""
    reap_after: Seconds = 300
    """Docker mode: a container of this pool whose task has ended, or that Klique does not
    know, is removed once seen so for this long."""

    @model_validator(mode="before")
    @classmethod
    def _gpus_of_gpu_ids(cls, data: Any) -> Any:
        """`gpu_ids` alone says how many GPUs; with `gpus` too, the two must agree."""
        if not isinstance(data, dict) or not isinstance(data.get("gpu_ids"), list):
            return data
        ids = data["gpu_ids"]
        if "gpus" in data and data["gpus"] != len(ids):
            raise ValueError(
                f"gpus is {data['gpus']} but gpu_ids names {len(ids)}; fix: drop gpus (gpu_ids "
                "says how many) or make them agree"
            )
        if any(not isinstance(i, int) or i < 0 for i in ids) or len(set(ids)) != len(ids):
            raise ValueError(
                f"gpu_ids {ids!r} must be distinct GPU numbers (0 or more), as nvidia-smi -L "
                "numbers them"
            )
        return {**data, "gpus": len(ids)}

    @model_validator(mode="after")
    def _container_settings(self) -> HostSettings:
        docker_only = {"runtime", "rootless", "selinux_relabel", "reap_after"}
        if self.mode == "venv" and (
            self.run_args or self.image or docker_only & self.model_fields_set
        ):
            raise ValueError(
                "runtime, run_args, image, rootless, selinux_relabel and reap_after apply in "
                "docker mode only; fix: set mode: docker"
            )
        if self.mode == "docker" and self.container_runtime:
            raise ValueError(
                "in docker mode the task's image is the container, so container_runtime has no "
                "use; fix: remove container_runtime (or set mode: venv)"
            )
        if self.mode == "docker" and (self.cache_dir or self.container_scratch):
            raise ValueError(
                "in docker mode a task's container sees only its job folder, not the host's "
                "cache_dir or container_scratch; fix: remove them (or set mode: venv)"
            )
        if not CDI_KIND.fullmatch(self.gpu_device):
            raise ValueError(
                f"gpu_device {self.gpu_device!r} is not a CDI device kind; fix: VENDOR/CLASS, "
                "e.g. nvidia.com/gpu"
            )
        for arg in self.run_args:
            check_run_arg(arg)
        return self

    @field_validator("image")
    @classmethod
    def _image(cls, image: str | None) -> str | None:
        return image and check_image(image, "the pool's image")


POOL_KIND = PoolKindSpec(
    name="host",
    settings=HostSettings,
    driver="broker.pools.host_docker:host_driver",  # HostDriver, or in docker mode its subclass
    queueing=False,
    summary="this machine: tasks run as processes in fixed slots, GPUs assigned by Klique",
)


def system_python() -> str:
    """The interpreter every account can run: the system's, not the server's own venv."""
    return shutil.which("python3", path=SYSTEM_PATH) or "python3"


class HostDriver(PoolDriver):
    transport: LocalTransport
    settings: HostSettings

    def __init__(self, pool: Pool, context: Context) -> None:
        super().__init__(pool, context)
        self.settings = settings_as(pool, HostSettings)
        self.transport = LocalTransport()
        self.single_user = not pool.user_map.maps_anyone
        self.server_account = pwd.getpwuid(os.geteuid()).pw_name
        # Without a user map, the server's own account keeps the job folders in its own home.
        self.job_root = self.settings.job_root or str(context.home / "jobs")
        self.python = self.settings.python or system_python()
        self.processes: dict[int, asyncio.subprocess.Process] = {}
        self._python_problems: dict[str, str | None] = {}
        # When an exit file was first seen beside a live runner (its claimed end, not yet true).
        self._exit_seen_at: dict[int, float] = {}

    # Who runs what.

    def account(self, task: Task) -> str:
        if not self.single_user:
            return super().account(task)
        if os.geteuid() == 0:
            raise NotPermitted(
                f"pool {self.pool.name} has no user_map and the server runs as root; Klique "
                "never runs tasks as root; fix: give the pool a user_map (Klique user: Linux "
                "account) and a job_root that the accounts share"
            )
        if task.owner != self.server_account:
            raise NotPermitted(
                f"pool {self.pool.name} has no user_map, so it runs only the tasks of "
                f"{self.server_account}, the account running the server; fix: ask the platform "
                f"team to map {task.owner} to a Linux account in the pool's user_map"
            )
        return self.server_account

    def check_account(self) -> str | None:
        if self.single_user:
            return None if os.geteuid() == 0 else self.server_account
        return super().check_account()

    async def check(self) -> list[str]:
        """The job root (a problem there stops the pool), then the runner's interpreter for
        each account (a problem there fails that account's tasks, with the reason)."""
        if self.single_user and os.geteuid() == 0:
            self.problems = [
                f"pool {self.pool.name} has no user_map and the server runs as root, so it runs "
                "no task; fix: give it a user_map and a shared job_root (`klique demo` makes an "
                "account and such an estate)"
            ]
            return self.problems
        if self.single_user and not self.settings.job_root:
            os.makedirs(self.job_root, mode=0o700, exist_ok=True)
        problems = list(await super().check())
        accounts = {*self.pool.user_map.accounts.values(), self.pool.user_map.default}
        if self.single_user:
            accounts = {self.server_account}
        for account in sorted(a for a in accounts if a):
            problem = await self.python_problem(account)
            if problem:
                problems.append(problem)
        return problems

    async def python_problem(self, account: str) -> str | None:
        """Why the runner's interpreter cannot run as account (None: it can), asked once."""
        if account not in self._python_problems:
            argv = [self.python, "-c", "import sys; sys.exit(sys.version_info < (3, 8))"]
            try:
                done = await self.transport.run(argv, account=account, timeout=30)
                words = done.stderr.strip() or f"exit {done.returncode}"
                failed = done.returncode != 0
            except KliqueError as exc:
                words, failed = str(exc), True
            self._python_problems[account] = (
                f"the runner's Python {self.python} cannot be run by {account} on this host "
                f"({words}); fix: set the pool's python to an interpreter (3.8 or later) that "
                "every mapped account can run"
                if failed
                else None
            )
        return self._python_problems[account]

    def uv_setting(self) -> str | None:
        # This server's own uv may sit in a folder the accounts cannot enter: staged by default.
        return super().uv_setting() or ("stage" if own_uv() else None)

    # The pool's side of the scheduler.

    async def capacity(self, active: Sequence[Task]) -> PoolState:
        return PoolState(
            self.pool.name,
            free_slots=self.pool.slots - len(active),
            reachable=not self.problems,
            reason="; ".join(self.problems),
        )

    async def submit(self, task: Task, report_token: str) -> Submission:
        account = self.account(task)
        problem = await self.python_problem(account)
        if problem:
            raise SubmitError(problem)
        await self.stage_uv(account)
        job_dir = str(task.job_dir)
        document = self.task_document(task, report_token, task.gpu_ids)
        files = {
            "task.json": (json.dumps(document, indent=2).encode(), 0o600),
            "klique-runner.pyz": (self.context.runner.read_bytes(), 0o600),
        }
        await self.transport.write_files(job_dir, files, account=account)
        process = await self.transport.spawn(
            # Standard library only: no site-packages, .pth files or PYTHON* (as in batch jobs).
            [self.python, "-I", "-S", f"{job_dir}/klique-runner.pyz", job_dir],
            account=account,
            env=runner_env(account),
            log=f"{job_dir}/runner.log",
        )
        self.processes[task.id] = process
        return Submission(native_id=str(process.pid), job_dir=job_dir)

    async def poll(self, tasks: Sequence[Task]) -> dict[int, Observation]:
        files = await self._read_job_files(tasks)
        news: dict[int, Observation] = {}
        for task in tasks:
            if task.job_dir is None or (task.state is not TaskState.PLACED and files is None):
                continue
            found = files.get(task.id, {}) if files else {}
            seen = await (
                self._adopt(task, found)
                if task.state is TaskState.PLACED
                else self._observe(task, found)
            )
            if seen is not None and (seen.state != task.state or seen.reason != task.reason):
                news[task.id] = seen
        return news

    async def _read_job_files(self, tasks: Sequence[Task]) -> dict[int, dict[str, bytes]] | None:
        """exit.json and status.json of every task, read as each account in one command."""
        by_account: dict[str, list[Task]] = {}
        for task in tasks:
            if task.job_dir:
                by_account.setdefault(self.account(task), []).append(task)
        found: dict[int, dict[str, bytes]] = {}
        for account, group in by_account.items():
            paths = [f"{t.job_dir}/{name}" for t in group for name in ("exit.json", "status.json")]
            data = await self.transport.read_files(paths, account=account)
            for task in group:
                prefix = f"{task.job_dir}/"
                found[task.id] = {
                    path.removeprefix(prefix): content
                    for path, content in data.items()
                    if path.startswith(prefix)
                }
        return found

    async def _adopt(self, task: Task, files: dict[str, bytes]) -> Observation:
        """After a crash between starting the runner and recording it: find it, or start over."""
        pid = _find_runner(str(task.job_dir), self._uids(task))
        if pid is not None or "exit.json" in files:
            return Observation(TaskState.SUBMITTED, native_id=pid or "", job_dir=task.job_dir)
        return Observation(TaskState.QUEUED, "its runner never started; starting it again")

    async def _observe(self, task: Task, files: dict[str, bytes]) -> Observation | None:
        exit_doc = parse_json(files.get("exit.json"))
        if self._alive(task):
            if exit_doc is None:
                self._exit_seen_at.pop(task.id, None)
                started = parse_json(files.get("status.json"))
                return Observation(TaskState.RUNNING) if started else None
            first = self._exit_seen_at.setdefault(task.id, time.monotonic())
            if time.monotonic() - first < CLAIM_GRACE_S:
                return None
            return Observation(
                TaskState.RUNNING,
                f"its runner reported that the task ended ({exit_doc.get('outcome')}), but the "
                "runner's process is still running: the report is ignored until the process ends",
            )
        self._exit_seen_at.pop(task.id, None)
        process = self.processes.pop(task.id, None)
        if exit_doc is None:  # a final look: it may have been written since the read
            again = await self.transport.read_files(
                [f"{task.job_dir}/exit.json"], account=self.account(task)
            )
            exit_doc = parse_json(again.get(f"{task.job_dir}/exit.json"))
        if exit_doc is not None:
            return observation_from_exit(exit_doc)
        log = f"{task.job_dir}/runner.log"
        if process is not None and process.returncode in _NOT_STARTED and not files:
            last = await self._last_line(task, log)
            return Observation(TaskState.FAILED, f"the runner could not be started: {last}")
        return Observation(
            TaskState.LOST, f"the runner ended without writing an exit file (see {log})"
        )

    async def _last_line(self, task: Task, path: str) -> str:
        data = await self.transport.read_file(path, account=self.account(task), limit=4096)
        lines = (data or b"").decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else f"see {path}"

    def _alive(self, task: Task) -> bool:
        process = self.processes.get(task.id)
        if process is not None:
            return process.returncode is None
        return bool(task.native_id) and _runs(str(task.native_id), str(task.job_dir))

    def _uids(self, task: Task) -> set[int]:
        """Who may own the runner's process: runuser (root) or the task's account."""
        return {0, os.geteuid(), pwd.getpwnam(self.account(task)).pw_uid}

    async def cancel(self, task: Task) -> None:
        if not task.native_id or not self._alive(task):
            return
        account = self.account(task)
        # The runner forwards SIGTERM to the task; sent as the account, it can reach no one else.
        await self.transport.signal([f"-{task.native_id}"], "TERM", account=account)
        deadline = time.monotonic() + _KILL_GRACE_S
        while self._alive(task) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if self._alive(task):
            targets = [f"-{task.native_id}"]
            status = parse_json(
                await self.transport.read_file(f"{task.job_dir}/status.json", account=account)
            )
            pid = status.get("pid") if status else None
            if type(pid) is int and pid > 1:
                targets.append(f"-{pid}")  # the task's own process group
            await self.transport.signal(targets, "KILL", account=account)

    async def close(self) -> None:
        self.processes.clear()  # runners live on; a restarted server adopts them


def runner_env(account: str) -> dict[str, str]:
    """The runner's whole environment: the account's identity and a system PATH."""
    entry = pwd.getpwnam(account)
    env = {
        "PATH": SYSTEM_PATH,
        "HOME": entry.pw_dir,
        "USER": account,
        "LOGNAME": account,
        "SHELL": entry.pw_shell or "/bin/sh",
        "LANG": os.environ.get("LANG", "C.UTF-8"),
    }
    env.update({k: os.environ[k] for k in _PASSED if k in os.environ})
    return env


def _runs(pid: str, job_dir: str) -> bool:
    """Whether process pid still runs this job folder's runner (pids are reused)."""
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
            cmdline = f.read()
    except (OSError, ValueError):
        return False
    return job_dir.encode() + b"/klique-runner.pyz" in cmdline


def _find_runner(job_dir: str, uids: set[int]) -> str | None:
    """The process that runs this job folder's runner, owned by one of uids; from /proc.
    The leader of its process group (runuser, when there is one) is the one signals go to."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid in uids and _runs(entry.name, job_dir):
                found.append(int(entry.name))
        except OSError:
            continue
    leaders = [pid for pid in found if _group_of(pid) == pid]
    return str((leaders or found)[0]) if found else None


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
