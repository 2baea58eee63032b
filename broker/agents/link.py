"""What a pool's agent tells the control plane: the calls of the `ControlPlane` protocol.

An agent inside the server calls the control plane's own side directly
(broker/control/store_link.py); `klique agent` on a login node sends the same calls over the
agent API (broker/agents/http_link.py), where that side applies them. Either way the control
plane keeps placement, policies and the ledger; agents only say what their pools did.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from broker.domain import Task, TaskState
from broker.execution import Observation, PoolState


class Attempt(NamedTuple):
    """A submission about to be made: the task and its new job folder."""

    task: Task
    job_dir: str


class Begun(NamedTuple):
    """An attempt the control plane recorded: the task, and the report token it minted for
    this attempt (its runner's only credential; the agent writes it into task.json)."""

    task: Task
    token: str


class Accepted(NamedTuple):
    """The pool took a task's job: its id there, and its folder."""

    task: Task
    native_id: str | None
    job_dir: str | None


class ControlPlane(Protocol):
    """The calls an agent makes; each returns once the control plane has recorded it."""

    async def holding(self, pool: str) -> list[Task]:
        """The pool's tasks: placed (to submit, or to look up), submitted, pending, running."""

    async def begin(self, attempts: Sequence[Attempt]) -> list[Begun | None]:
        """About to submit a batch: record each attempt's folder first, all at once, with a
        new report token the control plane makes (an agent never chooses one). None for a
        task no longer placed (cancelled meanwhile): submit nothing for it."""

    async def submitted(self, accepted: Sequence[Accepted]) -> list[bool]:
        """The pool accepted a batch's jobs, recorded at once; False for a task cancelled
        meanwhile (cancel its job)."""

    async def observed(self, news: Sequence[tuple[Task, Observation]]) -> None:
        """What a look at the pool saw of its tasks, recorded together."""

    async def requeue(
        self, task: Task, reason: str, *, skip: bool, only_from: Sequence[TaskState]
    ) -> None:
        """Back to Klique's queue (spill-over skips this pool next time)."""

    async def refused(self, task: Task, reason: str) -> None:
        """The pool refused a placed task: it fails with the pool's words."""

    async def cancelled(self, task: Task, reason: str) -> None: ...

    async def published(self, pool: str, state: PoolState, strangers: Sequence[str]) -> None:
        """The pool's latest capacity and reachability, for placement."""
