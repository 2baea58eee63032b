"""What every pool driver does, and the job directory they all share with the runner."""

from __future__ import annotations

import json
import shutil
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.domain import Estate, Pool, Task, TaskState, spec_to_dict
from broker.scheduler.placement import PoolState


@dataclass(frozen=True)
class Observation:
    """What a pool says of one of its tasks this cycle.

    For a task whose submission's outcome was unknown, SUBMITTED with the job found (its
    `native_id` and `job_dir`), or QUEUED when no job carries its tag and it may go again.
    """

    state: TaskState
    reason: str = ""
    exit_code: int | None = None
    preempted: bool = False
    native_id: str | None = None
    job_dir: str | None = None


# Outcomes that only the runner knows: the task itself ended, or (`timeout`) the scheduler's
# run-limit warning reached it (LSF's SIGUSR2), however the task ended after it. Any other
# ending (a signal) is the scheduler's to name: walltime, cancel, node failure.
RUNNER_OUTCOMES = ("completed", "failed", "setup_failed", "timeout")
PREEMPTED_MARKER = "preempted"  # docs/job-directory.md: the runner reports `preempted`


@dataclass(frozen=True)
class Submission:
    native_id: str
    job_dir: str


@dataclass(frozen=True)
class Context:
    """What drivers need from the server that started them."""

    estate: Estate
    home: Path
    runner: Path  # the runner zipapp, built once per server start
    api_url: str | None  # where runners report; None when they cannot reach the API


class PoolDriver(ABC):
    """One pool. The scheduler loop calls these; none of them may fail a task on its own."""

    def __init__(self, pool: Pool, context: Context) -> None:
        self.pool = pool
        self.context = context
        self.strangers: set[str] = set()  # native ids of jobs with Klique's tag no task owns

    @abstractmethod
    async def capacity(self, active: Sequence[Task]) -> PoolState:
        """Free capacity now, given the tasks Klique has in this pool."""

    @abstractmethod
    async def submit(self, task: Task) -> Submission:
        """Stand the task up in the pool. Raises SubmitError with the pool's own words."""

    @abstractmethod
    async def poll(self, tasks: Sequence[Task]) -> dict[int, Observation]:
        """One look at all of this pool's active tasks; tasks with no news are left out."""

    @abstractmethod
    async def cancel(self, task: Task) -> None:
        """Stop the task's job, queued or running."""

    def uv_path(self) -> str | None:
        """The uv the runner uses: the pool's setting, else this server's own (same machine)."""
        configured = self.pool.settings.get("uv")
        return str(configured) if configured else own_uv()

    async def preempt(self, task: Task) -> None:
        """Stop a run so that it ends as preempted: a marker the runner reads, then cancel."""
        if task.job_dir:
            await self.write_marker(task, PREEMPTED_MARKER)
        await self.cancel(task)

    async def write_marker(self, task: Task, name: str) -> None:
        path = Path(str(task.job_dir)) / name
        path.write_text("")

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and processes the driver holds."""

    def task_document(self, task: Task, gpus: Sequence[int] | None = None) -> dict[str, Any]:
        """task.json: see docs/job-directory.md."""
        spec = spec_to_dict(task.spec)
        report = None
        if self.context.api_url:
            report = {"url": self.context.api_url, "token": task.report_token}
        return {
            "version": 1,
            "id": task.id,
            "name": task.spec.name,
            "owner": task.owner,
            "project": task.spec.project,
            "resource": task.spec.resource,
            "pool": self.pool.name,
            "scheduler": self.pool.kind.value,
            "command": list(task.spec.command),
            "env": spec["env"],
            "code": spec["code"],
            "requirements": list(task.spec.requirements) or None,
            "requirements_file": task.spec.requirements_file,
            "image": task.spec.image,
            "gpus": None if gpus is None else list(gpus),
            "report": report,
            "cache_dir": self.pool.settings.get("cache_dir"),
            "uv": self.uv_path(),
        }


def own_uv() -> str | None:
    try:
        from uv import find_uv_bin
    except ImportError:
        return shutil.which("uv")
    try:
        return str(find_uv_bin())
    except FileNotFoundError:
        return shutil.which("uv")


def write_job_dir(job_dir: Path, document: Mapping[str, Any], runner: Path) -> None:
    """A local job directory with task.json and the runner (host pools, shared filesystems)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    tmp = job_dir / "task.json.tmp"
    tmp.write_text(json.dumps(document, indent=2))
    tmp.replace(job_dir / "task.json")
    shutil.copyfile(runner, job_dir / "klique-runner.pyz")


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def observation_from_exit(doc: Mapping[str, Any]) -> Observation:
    """The runner's exit.json decides how a task ended (docs/job-directory.md)."""
    code = doc.get("exit_code")
    outcome = doc.get("outcome", "")
    reason = str(doc.get("reason") or "")
    if outcome == "completed" or (code == 0 and outcome in ("", "completed")):
        return Observation(TaskState.COMPLETED, reason or "exit code 0", 0)
    if outcome == "preempted":
        return Observation(TaskState.FAILED, reason or "preempted", code, preempted=True)
    if outcome == "timeout":
        return Observation(TaskState.TIMEOUT, reason or "ran past its walltime", code)
    return Observation(TaskState.FAILED, reason or f"exit code {code}", code)
