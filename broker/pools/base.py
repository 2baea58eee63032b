"""What every pool driver does, and the job directory they all share with the runner."""

from __future__ import annotations

import json
import secrets
import shutil
import stat
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.domain import Estate, Pool, Task, TaskState, spec_to_dict
from broker.errors import KliqueError, NotPermitted, SubmitError
from broker.execution import Observation, PoolState, Submission
from broker.pools.settings import PoolSettings, settings_as
from broker.transport import Transport, check_account

# Outcomes that only the runner knows: the task itself ended, or (`timeout`) the scheduler's
# run-limit warning reached it (LSF's SIGUSR2), however the task ended after it. Any other
# ending (a signal) is the scheduler's to name: walltime, cancel, node failure.
RUNNER_OUTCOMES = ("completed", "failed", "setup_failed", "timeout")
PREEMPTED_MARKER = "preempted"  # docs/job-directory.md: the runner reports `preempted`


@dataclass(frozen=True)
class Context:
    """What drivers need from the server that started them."""

    estate: Estate
    home: Path
    runner: Path  # the runner zipapp, built once per server start
    api_url: str | None  # where runners report; None when they cannot reach the API


class PoolDriver(ABC):
    """One pool. The scheduler loop calls these; none of them may fail a task on its own.

    Everything inside a job folder is created, read, written and signalled as the task's
    mapped account, through `transport`: the server never touches a path a user can write.
    """

    transport: Transport
    job_root: str
    submit_batch = 1  # tasks the agent hands `submit_many` at once
    # How often the pool's scheduler may be asked for its jobs: its agent's clock
    # (broker/agents/timing.py) times the queries. None: asked at every look (a cheap answer).
    query_interval_s: float | None = None
    settings: PoolSettings  # each kind's driver narrows it to its own kind's model

    def __init__(self, pool: Pool, context: Context) -> None:
        self.pool = pool
        self.settings = settings_as(pool, PoolSettings)
        self.context = context
        self.strangers: set[str] = set()  # native ids of jobs with Klique's tag no task owns
        self.problems: list[str] = []  # found at start: the pool takes no task while there are any
        self.notes: list[str] = []  # found at start: how the pool works on this site (not problems)
        self._uv_staged: set[str] = set()

    def account(self, task: Task) -> str:
        """The Linux account the task runs as; NotPermitted with the reason otherwise."""
        account = self.pool.user_map.account_for(task.owner)
        if account is None:
            raise NotPermitted(
                f"user {task.owner} is not in the user_map of pool {self.pool.name}, which has "
                f"no default; fix: map {task.owner} to a Linux account under "
                f"pools.{self.pool.name}.user_map in the estate"
            )
        check_account(account)
        return account

    def new_job_dir(self, task: Task) -> str:
        """A fresh, unguessable folder name for this attempt: nobody can create it first."""
        name = f"{task.tag}-{max(task.attempts, 1)}-{secrets.token_hex(6)}"
        return f"{self.job_root.rstrip('/')}/{name}"

    async def check(self) -> list[str]:
        """Problems that keep this pool from running tasks safely, found at start (empty: none).
        The job root must not let one account plant or swap another's job folders."""
        account = self.check_account()
        if account is None:
            return []
        try:
            mode = await self.transport.mode(self.job_root, account=account)
        except KliqueError as exc:
            problems = [
                f"job_root {self.job_root}: {exc}; fix: create it on the shared filesystem with "
                "mode 1777 (install -d -m 1777)"
            ]
        else:
            problem = job_root_problem(self.job_root, mode)
            problems = [problem] if problem else []
        self.problems = problems
        return problems

    def check_account(self) -> str | None:
        """An account to run start-up checks as (None: none is mapped)."""
        accounts = [*self.pool.user_map.accounts.values(), self.pool.user_map.default]
        # A same-name rule names no account in advance: the pool's query_account checks.
        accounts.append(self.settings.query_account)
        return next((str(a) for a in accounts if a), None)

    async def read_console(
        self, task: Task, offset: int, limit: int, rank: int = 0
    ) -> bytes | None:
        """Up to `limit` bytes of the task's console from `offset`, read as its account (on
        several nodes: rank N's console.rankN.log; rank 0's is console.log)."""
        if not task.job_dir:
            return None
        name = f"console.rank{rank}.log" if rank else "console.log"
        return await self.transport.read_file(
            f"{task.job_dir}/{name}", account=self.account(task), offset=offset, limit=limit
        )

    @abstractmethod
    async def capacity(self, active: Sequence[Task]) -> PoolState:
        """Free capacity now, given the tasks Klique has in this pool."""

    def batches(self, tasks: Sequence[Task]) -> list[list[Task]]:
        """How the agent hands new tasks to `submit_many`: `submit_batch` at a time."""
        size = max(self.submit_batch, 1)
        return [list(tasks[start : start + size]) for start in range(0, len(tasks), size)]

    @abstractmethod
    async def submit(self, task: Task, report_token: str) -> Submission:
        """Stand the task up in `task.job_dir` (new). Raises SubmitError with the pool's words.
        `report_token` goes into task.json only: the store keeps its digest."""

    async def submit_many(self, tasks: Sequence[tuple[Task, str]]) -> list[Submission | Exception]:
        """`submit` for each (task, report token), in order: each one's Submission, or what
        `submit` raised for it. Pools that can submit several tasks in one command override it
        (and `submit_batch`, how many the agent hands over at once)."""
        results: list[Submission | Exception] = []
        for task, report_token in tasks:
            try:
                results.append(await self.submit(task, report_token))
            except Exception as exc:  # the caller judges each task's outcome
                results.append(exc)
        return results

    @abstractmethod
    async def poll(self, tasks: Sequence[Task]) -> dict[int, Observation]:
        """One look at all of this pool's active tasks; tasks with no news are left out."""

    @abstractmethod
    async def cancel(self, task: Task) -> None:
        """Stop the task's job, queued or running."""

    def outcome_unknown(self, task_id: int) -> str | None:
        """Why a placed task waits where its submission's reply was lost; None otherwise."""
        return None

    def uv_setting(self) -> str | None:
        """The pool's `uv`: a path on the nodes, `stage`, or unset (the node's PATH)."""
        return self.settings.uv or None

    def uv_path(self, task: Task) -> str | None:
        """`uv: stage` puts this server's uv in a private folder of each account under job_root
        (no account runs a uv another could have replaced); a path names the node's own; unset,
        the runner looks on the node's PATH (and falls back to venv + pip)."""
        if self.uv_setting() == "stage":
            return f"{self._stage_dir(self.account(task))}/uv"
        return self.uv_setting()

    def _stage_dir(self, account: str) -> str:
        return f"{self.job_root.rstrip('/')}/.klique-{account}"

    async def stage_uv(self, account: str) -> None:
        """Copy this server's uv into the account's private folder once (mode 500)."""
        if self.uv_setting() != "stage" or account in self._uv_staged:
            return
        folder = self._stage_dir(account)
        await self.transport.private_dir(folder, account=account)
        staged = f"{folder}/uv"
        if not await self.transport.executable(staged, account=account):
            source = own_uv()
            if source is None:
                raise SubmitError(
                    "the pool says `uv: stage` but this server has no uv to stage; "
                    "fix: install uv beside the server, or name the node's uv"
                )
            data = Path(source).read_bytes()
            await self.transport.write_file(staged, data, account=account, mode=0o500)
        self._uv_staged.add(account)

    async def preempt(self, task: Task) -> None:
        """Stop a run so that it ends as preempted: a marker the runner reads, then cancel."""
        if task.job_dir:
            await self.write_marker(task, PREEMPTED_MARKER)
        await self.cancel(task)

    async def write_marker(self, task: Task, name: str) -> None:
        await self.transport.write_file(f"{task.job_dir}/{name}", b"", account=self.account(task))

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and processes the driver holds."""

    def task_document(
        self, task: Task, report_token: str, gpus: Sequence[int] | None = None
    ) -> dict[str, Any]:
        """task.json: see docs/job-directory.md."""
        spec = spec_to_dict(task.spec)
        report = None
        if self.context.api_url:
            report = {"url": self.context.api_url, "token": report_token}
        return {
            "version": 1,
            "id": task.id,
            "name": task.spec.name,
            "owner": task.owner,
            "project": task.spec.project,
            "resource": task.spec.resource,
            "pool": self.pool.name,
            "scheduler": self.pool.kind,
            "command": list(task.spec.command),
            "env": spec["env"],
            "code": spec["code"],
            "requirements": list(task.spec.requirements) or None,
            "requirements_file": task.spec.requirements_file,
            "image": task.spec.image,
            "gpus": None if gpus is None else list(gpus),
            "report": report,
            "cache_dir": self.settings.cache_dir,
            "uv": self.uv_path(task),
            "runtime": self.settings.container_runtime,
            "container_scratch": self.settings.container_scratch,
            "container_home": self.settings.container_home,
            "container_gpus": self.settings.container_gpus,
            "gpus_requested": _asks_for_gpus_of(self.context.estate, task),
            "parameters": task.parameters,
            "app": task.spec.app,  # an application's route and walltime (broker/apps/launch.py)
        }


def _asks_for_gpus_of(estate: Estate, task: Task) -> bool:
    """The task's compute resource asks for GPUs (a container then gets their driver
    libraries, whatever GPU variables the scheduler sets)."""
    resource = estate.resources.get(task.resource)
    return bool(resource is not None and resource.profile.whole_gpus)


def own_uv() -> str | None:
    try:
        from uv import find_uv_bin
    except ImportError:
        return shutil.which("uv")
    try:
        return str(find_uv_bin())
    except FileNotFoundError:
        return shutil.which("uv")


def job_root_problem(path: str, mode: int) -> str | None:
    """Why other accounts could plant or swap job folders in a job root of this mode, or None."""
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
        return (
            f"job_root {path} (mode {mode:o}) is writable by other accounts without the sticky "
            f"bit, so one account could rename or replace another's job folders; fix: "
            f"chmod 1777 {path} (or o-w, g-w)"
        )
    return None


def parse_json(data: bytes | None) -> dict[str, Any] | None:
    """A JSON object from a job file's bytes; None for anything else (the file is the job's)."""
    if not data:
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


_REASON_CHARS = 2000


def observation_from_exit(doc: Mapping[str, Any]) -> Observation:
    """The runner's exit.json says how a task ended (docs/job-directory.md). It is the job's
    own claim: values that are not what the runner writes are dropped, never trusted."""
    raw_code = doc.get("exit_code")
    code = raw_code if type(raw_code) is int and -(2**31) <= raw_code < 2**31 else None
    outcome = doc.get("outcome", "")
    raw_reason = doc.get("reason")
    reason = raw_reason[:_REASON_CHARS] if isinstance(raw_reason, str) else ""
    reason = "".join(c if c.isprintable() else " " for c in reason)
    if outcome == "completed" or (code == 0 and outcome in ("", "completed")):
        return Observation(TaskState.COMPLETED, reason or "exit code 0", 0)
    if outcome == "preempted":
        return Observation(TaskState.FAILED, reason or "preempted", code, preempted=True)
    if outcome == "timeout":
        return Observation(TaskState.TIMEOUT, reason or "ran past its walltime", code)
    return Observation(TaskState.FAILED, reason or f"exit code {code}", code)
