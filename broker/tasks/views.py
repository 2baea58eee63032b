"""The presenters of tasks: a task as every adapter shows it (TaskOut), and why it waits
(WhyOut). The REST API, the web UI and the SDK's endpoints all show a task through here."""

from __future__ import annotations

from broker.domain import Task, TaskState
from broker.scheduler.model import PendingReason
from broker.store.datasets import DatasetStore
from broker.tasks.control import TaskControl
from broker.tasks.schemas import ArtifactOut, TaskOut, WhyOut


def task_out(task: Task, loop: TaskControl, detail: bool = False) -> TaskOut:
    """The task, with the last cycle's reason for a queued one; `detail` adds its events,
    scalars, packages, artifacts and the dataset versions it read (one task's page, not a
    listing's row)."""
    out = TaskOut.of(task)
    waiting = loop.pending.get(task.id)
    if waiting is not None and task.state is TaskState.QUEUED:
        out.reason = waiting.text
    if detail:
        out.events = loop.store.events(task.id)
        out.scalars = loop.store.scalars(task.id)
        out.packages = list(task.packages)
        out.artifacts = [ArtifactOut(**a) for a in loop.store.artifacts(task.id)]
        out.datasets = DatasetStore(loop.store).reads(task.id)
    return out


def why_out(loop: TaskControl, task: Task) -> WhyOut:
    """Why the task waits, as the control loop sees it now; for one that does not wait, its
    state and the reason it last changed."""
    return why_of(task, loop.why(task))


def why_of(task: Task, reason: PendingReason | None) -> WhyOut:
    if reason is None:
        return WhyOut(
            id=task.id,
            state=task.state,
            waiting=False,
            primary="",
            sentence="",
            detail=task.reason or f"the task is {task.state.value}",
            pools={},
            reason=task.reason,
        )
    return WhyOut(
        id=task.id,
        state=task.state,
        waiting=True,
        primary=reason.primary.value,
        sentence=reason.primary.sentence,
        detail=reason.detail,
        pools=dict(reason.pools),
        reason=reason.text,
    )
