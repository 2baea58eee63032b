"""What a pool and the scheduler tell each other: a pool's capacity this cycle (`PoolState`),
what it saw of a task (`Observation`), the job it made of one (`Submission`), and the states
a task holds a place in a pool in (`HOLDING`, `ACTIVE`).

The pure scheduler reads these and the pool drivers and agents write them; this module sits
below both, so that neither imports the other. It imports only the domain.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from broker.domain import TaskState

# The states of a task in a pool: ACTIVE once its job exists there; HOLDING from placement on.
ACTIVE = (TaskState.SUBMITTED, TaskState.PENDING, TaskState.RUNNING)
HOLDING = (TaskState.PLACED, *ACTIVE)


@dataclass(frozen=True)
class PoolState:
    """What a pool reported this cycle.

    Queueing pools: `free_gpus`/`free_cpus`/`free_slots` are what could start now (None: the
    pool does not count it), and `queued` is how many of Klique's tasks wait in its queue.
    Host pools: only `reachable` and `reason` are read; Klique counts a host's capacity itself
    from the estate and the active tasks. A pool with no report this cycle is unreachable.
    """

    name: str
    free_slots: int | None = None
    free_gpus: float = 0.0
    free_cpus: int | None = None
    queued: int = 0
    reachable: bool = True
    reason: str = ""
    last_good: float | None = None  # wall-clock time of the pool's last good answer
    free_nodes: int | None = None  # queueing pools: idle nodes, where the pool counts them
    # Placed tasks whose submission's reply was lost, with why they wait (`klique why`): the
    # control plane reads a remote pool's from here, as it cannot ask its driver.
    outcome_unknown: Mapping[int, str] = field(default_factory=dict)
    # The agent's own counts since it started, published with each snapshot: what /metrics
    # shows as its looks and status queries (broker/metrics.py), for remote pools as well.
    looks: int = 0
    status_queries: int = 0


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
    # A phase within a state (a running job's nodes still booting, or its execution suspended):
    # shown in the reason; `charged` False keeps it out of the ledger (the pool's charge_phases).
    phase: str = ""
    charged: bool = True
    # The job never ran (its node failed to boot), or its node failed where the pool leaves
    # reruns to Klique (Slurm's `requeue: klique`): it goes again from Klique's queue.
    retry: bool = False
    requeued: bool = False  # the scheduler requeued a running job (its restart count grew)


@dataclass(frozen=True)
class Submission:
    """The job a pool made of a task: its native id, in the task's job folder."""

    native_id: str
    job_dir: str
