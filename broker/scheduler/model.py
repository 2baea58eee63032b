"""The scheduler's inputs and outputs: plain frozen data that the control loop
(broker/control/loop.py) fills and reads, and `active_of`, a held task as placement sees it.

`broker.scheduler.placement` re-exports the data types here; a pool's state is a leaf type both
sides share (broker/execution.py: PoolState).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from broker.domain import Estate, Task, TaskState
from broker.execution import PoolState


@dataclass(frozen=True)
class SchedulerSettings:
    """Knobs for reclaim and starvation; the defaults suit a cycle every few seconds."""

    min_run_s: float = 600.0  # a run younger than this is never preempted
    grace_s: float = 120.0  # a task waits this long before its reservation preempts anyone
    max_preemptions_per_cycle: int = 8  # bounds churn when several reservations wake at once
    starvation_s: float = 3600.0  # a task waiting longer goes first and pins a host pool


@dataclass(frozen=True)
class QueuedTask:
    """A task waiting in Klique for a pool."""

    id: int
    owner: str
    team: str | None
    resource: str
    queued_at: float  # when it first entered the queue: age orders ties and starvation
    skip_pools: frozenset[str] = frozenset()  # pools it was withdrawn from (spill-over)


@dataclass(frozen=True)
class ActiveTask:
    """A task that holds, or waits for, capacity in a pool."""

    id: int
    owner: str
    team: str | None
    resource: str
    pool: str
    running: bool  # False: still waiting in the pool's own queue
    since: float  # started running, or entered the pool's queue
    borrowed: bool = False
    gpus: tuple[int, ...] = ()  # host pools: the GPUs it was given (PlacementDecision.gpus)
    preempted: bool = False  # asked to stop by a reclaim and not gone yet
    skip_pools: frozenset[str] = frozenset()  # pools it was withdrawn from before this one
    native_reason: str = ""  # the pool's own word for why it waits (squeue %r, ...)


@dataclass(frozen=True)
class PlacementDecision:
    task_id: int
    pool: str
    borrowed: bool = False  # uses a reservation another team is not using: may be reclaimed
    gpus: tuple[int, ...] = ()  # host pools: the GPUs to give it (CUDA_VISIBLE_DEVICES)


class PendingCode(enum.StrEnum):
    """Why a task waits, in precedence order: the first that applies is the primary reason."""

    NOT_PERMITTED = "not-permitted"
    OVER_LIMIT = "over-limit"
    RECLAIM = "reclaim"
    NO_CAPACITY = "no-capacity"
    POOL_QUEUE = "pool-queue"
    OUTCOME_UNKNOWN = "outcome-unknown"  # placed: the submit command's reply was lost

    @property
    def sentence(self) -> str:
        return _SENTENCES[self]


_SENTENCES = {
    PendingCode.NOT_PERMITTED: "the team's policy does not permit this compute resource",
    PendingCode.OVER_LIMIT: "the team is at its limit for this compute resource",
    PendingCode.RECLAIM: "borrowed runs are handing back the team's reservation",
    PendingCode.NO_CAPACITY: "no pool in the profile can start it now",
    PendingCode.POOL_QUEUE: "pending in the pool's own queue",
    PendingCode.OUTCOME_UNKNOWN: "its submission's reply was lost: the pool may have queued it",
}


@dataclass(frozen=True)
class PendingReason:
    """Why a task waits: one primary reason, a sentence about this task, a per-pool breakdown."""

    primary: PendingCode
    detail: str  # what this task adds to the sentence ("" when nothing); never the sentence again
    pools: dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The one line that `why`, `ls` and the UI show: the sentence, then the detail."""
        return joined_reason(self.primary.sentence, self.detail)


def joined_reason(sentence: str, detail: str) -> str:
    """`sentence: detail`, each said once: a detail that repeats the sentence adds nothing."""
    sentence, detail = sentence.strip(), detail.strip()
    if not detail or detail == sentence:
        return sentence
    if detail.startswith(sentence):
        return detail
    return f"{sentence}: {detail}"


@dataclass(frozen=True)
class SchedulerInput:
    estate: Estate
    queued: Sequence[QueuedTask]
    active: Sequence[ActiveTask]
    pools: Mapping[str, PoolState]
    usage: Mapping[str, float] = field(default_factory=dict)  # team -> decayed GPU-seconds
    now: float = 0.0
    settings: SchedulerSettings = SchedulerSettings()


@dataclass(frozen=True)
class SchedulerOutput:
    placements: list[PlacementDecision]
    pending: dict[int, PendingReason]  # queued tasks that stay, and tasks in a pool's own queue
    withdrawals: list[int] = field(default_factory=list)  # spill-over: cancel in pool, requeue
    preemptions: list[int] = field(default_factory=list)  # reclaim: stop and requeue


def active_of(task: Task, now: float) -> ActiveTask:
    """A task a pool holds, as placement sees it."""
    running = task.state is TaskState.RUNNING
    since = (task.started_at if running else task.submitted_at) or now
    return ActiveTask(
        task.id,
        task.owner,
        task.team,
        task.resource,
        task.pool or "",
        running,
        since,
        borrowed=task.borrowed,
        gpus=task.gpu_ids,
        preempted=task.preempted,
        skip_pools=task.skip_pools,
        native_reason=task.reason,
    )
