"""The host pool: tasks run through the runner as processes on this machine, in fixed slots."""

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


class GpuInventory:
    """Which of the host's GPUs each task holds; fractions share a GPU."""

    def __init__(self, count: int) -> None:
        self.used = [0.0] * count
        self.held: dict[int, list[tuple[int, float]]] = {}

    @property
    def free(self) -> float:
        return sum(1.0 - u for u in self.used)

    def take(self, task_id: int, share: float) -> list[int]:
        if task_id in self.held:
            return [gpu for gpu, _ in self.held[task_id]]
        if share <= 0:
            self.held[task_id] = []
            return []
        if share < 1:
            gpu = next((g for g, u in enumerate(self.used) if u + share <= 1 + 1e-9), None)
            grant = [] if gpu is None else [(gpu, share)]
        else:
            whole = [g for g, u in enumerate(self.used) if u == 0][: int(share)]
            grant = [(g, 1.0) for g in whole] if len(whole) == int(share) else []
        if not grant:
            raise SubmitError(f"needs {share:g} GPUs, {self.free:g} free on this host")
        for gpu, part in grant:
            self.used[gpu] += part
        self.held[task_id] = grant
        return [gpu for gpu, _ in grant]

    def give_back(self, task_id: int) -> None:
        for gpu, part in self.held.pop(task_id, []):
            self.used[gpu] = max(0.0, self.used[gpu] - part)


class HostDriver(PoolDriver):
    def __init__(self, pool: Pool, context: Context) -> None:
        super().__init__(pool, context)
        self.job_root = Path(str(pool.settings.get("job_root") or context.home / "jobs"))
        self.python = str(pool.settings.get("python") or sys.executable)
        self.gpus = GpuInventory(pool.gpus)
        self.processes: dict[int, asyncio.subprocess.Process] = {}

    async def capacity(self, active: Sequence[Task]) -> PoolState:
        held = {t.id for t in active}
        for task_id in list(self.gpus.held):
            if task_id not in held:
                self.gpus.give_back(task_id)
        for task in active:  # tasks adopted after a restart hold their GPUs again
            if task.id not in self.gpus.held and task.job_dir:
                doc = read_json(Path(task.job_dir) / "task.json") or {}
                self._hold(task.id, doc.get("gpus") or [], task.gpus)
        return PoolState(
            self.pool.name, free_slots=self.pool.slots - len(active), free_gpus=self.gpus.free
        )

    def _hold(self, task_id: int, gpus: list[int], share: float) -> None:
        part = share if share < 1 else 1.0
        self.gpus.held[task_id] = [(g, part) for g in gpus if g < len(self.gpus.used)]
        for g, p in self.gpus.held[task_id]:
            self.gpus.used[g] += p

    async def submit(self, task: Task) -> Submission:
        job_dir = self.job_root / str(task.id)
        gpus = self.gpus.take(task.id, task.gpus)
        try:
            account = self._account(task)
            write_job_dir(job_dir, self.task_document(task, gpus), self.context.runner)
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
        except (OSError, NotPermitted) as exc:
            self.gpus.give_back(task.id)
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
            seen = self._observe(task)
            if seen is not None and seen.state != task.state:
                news[task.id] = seen
        return news

    def _observe(self, task: Task) -> Observation | None:
        job_dir = Path(task.job_dir or self.job_root / str(task.id))
        exit_doc = read_json(job_dir / "exit.json")
        if exit_doc is not None:
            self._forget(task.id)
            return observation_from_exit(exit_doc)
        if self._alive(task):
            status = read_json(job_dir / "status.json") or {}
            return Observation(TaskState.RUNNING) if status.get("state") else None
        # The process is gone: a final look for the exit file it may have written meanwhile.
        exit_doc = read_json(job_dir / "exit.json")
        self._forget(task.id)
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

    def _forget(self, task_id: int) -> None:
        self.processes.pop(task_id, None)
        self.gpus.give_back(task_id)

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
        self._forget(task.id)

    async def close(self) -> None:
        self.processes.clear()  # runners live on; a restarted server adopts them


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def _chown_tree(path: Path, account: str) -> None:
    entry = pwd.getpwnam(account)
    for item in [path, *path.rglob("*")]:
        os.chown(item, entry.pw_uid, entry.pw_gid)
