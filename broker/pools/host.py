"""The host pool: tasks run through the runner as processes on this machine, in fixed slots.

Placement counts the host's slots and GPUs and picks the GPU ids (Task.gpu_ids); this
driver starts the runner, follows it through its files and signals it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from broker.domain import Pool, Task, TaskState
from broker.errors import NotPermitted, SubmitError
from broker.pools.base import (
    Context,
    Observation,
    PoolDriver,
    Submission,
    observation_from_exit,
    read_json,
    write_job_dir,
)
from broker.scheduler.placement import PoolState

_KILL_GRACE_S = 10.0
_PID_FILE = "runner.pid"


class HostDriver(PoolDriver):
    def __init__(self, pool: Pool, context: Context) -> None:
        super().__init__(pool, context)
        self.job_root = Path(str(pool.settings.get("job_root") or context.home / "jobs"))
        self.python = str(pool.settings.get("python") or sys.executable)
        self.processes: dict[int, asyncio.subprocess.Process] = {}

    async def capacity(self, active: Sequence[Task]) -> PoolState:
        return PoolState(self.pool.name, free_slots=self.pool.slots - len(active))

    async def submit(self, task: Task) -> Submission:
        job_dir = self.job_root / task.job_name()
        try:
            account = self._account(task)
            write_job_dir(job_dir, self.task_document(task, task.gpu_ids), self.context.runner)
            argv = [self.python, str(job_dir / "klique-runner.pyz"), str(job_dir)]
            if account is not None:
                _chown_tree(job_dir, account)
                argv = ["runuser", "-u", account, "--", *argv]
            with open(job_dir / "runner.log", "ab") as log:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    cwd=job_dir,
                    start_new_session=True,
                )
            (job_dir / _PID_FILE).write_text(str(process.pid))
        except OSError as exc:
            raise SubmitError(f"could not start the runner on {self.pool.name}: {exc}") from exc
        self.processes[task.id] = process
        return Submission(native_id=str(process.pid), job_dir=str(job_dir))

    def _account(self, task: Task) -> str | None:
        """The Linux account to run as; None runs as the server's own account."""
        if not self.pool.user_map.accounts and self.pool.user_map.default is None:
            return None
        account = self.pool.user_map.account_for(task.owner)
        if account is None:
            raise NotPermitted(
                f"user {task.owner!r} has no account in pool {self.pool.name!r}'s "
                "user_map; fix: map it, or set a default, in the estate"
            )
        try:
            entry = pwd.getpwnam(account)
        except KeyError:
            raise NotPermitted(f"Linux account {account!r} does not exist on this host") from None
        if entry.pw_uid == 0:
            raise NotPermitted(
                f"account {account!r} resolves to uid 0; Klique never runs tasks "
                "as root: map the user to an ordinary account"
            )
        return account

    async def poll(self, tasks: Sequence[Task]) -> dict[int, Observation]:
        news: dict[int, Observation] = {}
        for task in tasks:
            seen = self._adopt(task) if task.state is TaskState.PLACED else self._observe(task)
            if seen is not None and seen.state != task.state:
                news[task.id] = seen
        return news

    def _adopt(self, task: Task) -> Observation:
        """After a crash between starting the runner and recording it: find it, or start over."""
        job_dir = self.job_root / task.job_name()
        try:
            pid = (job_dir / _PID_FILE).read_text().strip()
        except OSError:
            return Observation(TaskState.QUEUED, "its runner never started; starting it again")
        return Observation(TaskState.SUBMITTED, native_id=pid, job_dir=str(job_dir))

    def _observe(self, task: Task) -> Observation | None:
        job_dir = Path(task.job_dir or self.job_root / task.job_name())
        exit_doc = read_json(job_dir / "exit.json")
        if exit_doc is not None:
            self.processes.pop(task.id, None)
            return observation_from_exit(exit_doc)
        if self._alive(task):
            status = read_json(job_dir / "status.json") or {}
            return Observation(TaskState.RUNNING) if status.get("state") else None
        # The process is gone: a final look for the exit file it may have written meanwhile.
        exit_doc = read_json(job_dir / "exit.json")
        self.processes.pop(task.id, None)
        if exit_doc is not None:
            return observation_from_exit(exit_doc)
        return Observation(
            TaskState.LOST,
            f"the runner ended without writing an exit file (see {job_dir / 'runner.log'})",
        )

    def _alive(self, task: Task) -> bool:
        process = self.processes.get(task.id)
        if process is not None:
            return process.returncode is None
        # Adopted after a restart: the pid is alive and still runs this task's runner.
        try:
            cmdline = Path(f"/proc/{task.native_id}/cmdline").read_bytes()
        except (OSError, ValueError):
            return False
        return str(task.job_dir).encode() in cmdline

    async def cancel(self, task: Task) -> None:
        if not task.native_id or not self._alive(task):
            return
        pid = int(task.native_id)
        _signal_group(pid, signal.SIGTERM)
        process = self.processes.get(task.id)
        if process is not None:
            try:
                await asyncio.wait_for(process.wait(), _KILL_GRACE_S)
            except TimeoutError:
                _signal_group(pid, signal.SIGKILL)

    async def close(self) -> None:
        self.processes.clear()  # runners live on; a restarted server adopts them


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def _chown_tree(path: Path, account: str) -> None:
    entry = pwd.getpwnam(account)
    for item in [path, *path.rglob("*")]:
        os.chown(item, entry.pw_uid, entry.pw_gid)
