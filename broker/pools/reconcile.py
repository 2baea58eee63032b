"""Reconciliation: what a batch scheduler says of a job (its listing, its accounting record,
its restart count, the runner's exit file) against what Klique believes of the task (its
state, its attempts, when its job was first missed) -> what the pool observes this cycle.

Pure functions: no I/O and no clock (the time is an argument). BatchDriver runs the commands
and reads the files; its JobMemory keeps, between looks, what each `Verdict` says to keep. The
rules live here, each once, in order of a job's life:

1. A job still in the queue maps through the scheduler's state table; a restart count that
   grew on a running task means the scheduler requeued it (`listed`).
2. Once a job ends, the runner's exit file is the truth, unless the scheduler ended the job
   itself (walltime, cancel, node failure, preemption) (`ended`).
3. A job that ended by itself, or left the queue, with no exit file and no accounting record
   is LOST once the grace period (`lost_after`) is over: the file may still appear until then
   (`out_of_grace`, the one grace rule).
4. A task whose submission's reply was lost goes again only when two looks a message timeout
   apart both miss its job (`missed`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from broker.domain import Task, TaskState
from broker.execution import Observation
from broker.pools.arrays import ARRAY_NAME
from broker.pools.base import PREEMPTED_MARKER, RUNNER_OUTCOMES, observation_from_exit
from broker.pools.native import NativeStatus

NEVER_RAN_TRIES = 3  # attempts for a task whose jobs never ran (nodes that fail to boot)
# The phase of a pending task whose job the scheduler requeued and holds (BatchDriver.held).
HELD_PHASE = "held"
TAG = re.compile(r"klique-\d+")  # a task's job name (Task.tag)


@dataclass(frozen=True)
class StateTables:
    """What one scheduler's words mean: its driver's literal tables (see BatchDriver's class
    attributes for each), and the pool's settings that change a reading."""

    kind: str
    states: Mapping[str, TaskState]
    reasons: Mapping[str, str] = field(default_factory=dict)
    preempted: frozenset[str] = frozenset()
    self_ended: frozenset[str] = frozenset()
    phases: Mapping[str, str] = field(default_factory=dict)
    never_ran: frozenset[str] = frozenset()
    ending: frozenset[str] = frozenset()
    node_failed: frozenset[str] = frozenset()
    reruns_node_failures: bool = False  # the pool leaves a failed node's job to Klique
    charged: frozenset[str] = frozenset()  # phases the ledger charges (charge_phases)
    lost_after_s: float = 120.0  # the grace period of rule 3

    def state(self, status: NativeStatus) -> TaskState | None:
        """The common state of a native one (None: a state the table does not know)."""
        return self.states.get(status.state)

    def reason(self, status: NativeStatus) -> str:
        """The table's words for the state, and the scheduler's own detail."""
        base = self.reasons.get(status.state, "")
        detail = status.reason if status.reason not in ("", "None") else ""
        return "; ".join(p for p in (base, detail) if p)


@dataclass(frozen=True)
class Believed:
    """What Klique believes of a task whose job a pool runs."""

    state: TaskState
    attempts: int = 1
    job_dir: str | None = None
    native_id: str | None = None
    missing_since: float | None = None  # when its end was first seen without an exit file
    restarts: int | None = None  # the job's restart count when it was last seen running


@dataclass(frozen=True)
class Verdict:
    """What a look at one task's job says, and what the driver keeps for the next look."""

    observation: Observation | None  # None: no news (or none yet: a grace period runs)
    missing_since: float | None = None  # keep (None: forget)
    restarts: int | None = None  # keep (None: forget)
    ended: bool = False  # the job's end is read: its phase is forgotten too


@dataclass
class JobMemory:
    """What a driver remembers of each task's job between looks (by task id), as the
    verdicts say to keep it."""

    missing_since: dict[int, float] = field(default_factory=dict)
    restarts: dict[int, int] = field(default_factory=dict)
    phases: dict[int, str] = field(default_factory=dict)  # the phase last reported

    def believed(self, task: Task) -> Believed:
        """What Klique believes of the task, with what is remembered of its job."""
        return Believed(
            state=task.state,
            attempts=task.attempts,
            job_dir=task.job_dir,
            native_id=task.native_id,
            missing_since=self.missing_since.get(task.id),
            restarts=self.restarts.get(task.id),
        )

    def keep(self, task_id: int, verdict: Verdict) -> Observation | None:
        """Remember what a verdict keeps for the task's next look; its observation."""
        _remember(self.missing_since, task_id, verdict.missing_since)
        _remember(self.restarts, task_id, verdict.restarts)
        if verdict.ended:
            self.phases.pop(task_id, None)
        return verdict.observation

    def new_phase(self, task_id: int, phase: str) -> bool:
        """A phase change is news even where the state stays (running, then suspended); a
        task first seen in a phase since start is reported, so the ledger pauses."""
        known = self.phases.get(task_id, "")
        self.phases[task_id] = phase
        return known != phase


def _remember(memory: dict[int, Any], task_id: int, value: Any) -> None:
    """Keep a value for the task's next look (None: forget it)."""
    if value is None:
        memory.pop(task_id, None)
    else:
        memory[task_id] = value


def out_of_grace(missing_since: float | None, now: float, grace_s: float) -> tuple[bool, float]:
    """Rule 3: whether a job missing since `missing_since` (None: first missed now) has been
    missing for the grace period; and when it was first missed."""
    since = now if missing_since is None else missing_since
    return now - since >= grace_s, since


def listed(
    tables: StateTables,
    believed: Believed,
    status: NativeStatus,
    exit_doc: Mapping[str, Any] | None,
    now: float,
    held_advice: str = "",
) -> Verdict:
    """A job the status command lists (its state known to the table). `held_advice`: what to
    do about a job the scheduler requeued and holds ("" for any other job)."""
    state = tables.states[status.state]
    if state.final:
        return ended(tables, believed, status, exit_doc, now)
    grew, restarts = requeued(tables, believed, status, state)
    if grew:
        reason = "; ".join(p for p in (requeue_reason(tables, status), held_advice) if p)
        phase = HELD_PHASE if held_advice else ""
        seen = Observation(TaskState.PENDING, reason, phase=phase, requeued=True)
    elif held_advice:
        reason = "; ".join(p for p in (tables.reason(status), held_advice) if p)
        seen = Observation(state, reason, phase=HELD_PHASE, charged=False)
    else:
        phase = tables.phases.get(status.state, "")
        charged = not phase or phase in tables.charged
        seen = Observation(state, tables.reason(status), phase=phase, charged=charged)
    return Verdict(seen, missing_since=None, restarts=restarts)


def requeued(
    tables: StateTables, believed: Believed, status: NativeStatus, state: TaskState
) -> tuple[bool, int | None]:
    """Whether a running task's job was requeued: its restart count grew since it was seen;
    and the count to remember. The job may still show its old run ending (Slurm's
    COMPLETING), or run again already when the next listing comes; the count alone tells. A
    listing older than the runner's report has no greater count, and without a count nothing
    moves a running task back. A job first seen running with a count (the agent has just
    started) was requeued before: the count is only remembered."""
    if status.restarts is None:
        return False, believed.restarts
    known = believed.restarts
    remembered = max(known or 0, status.restarts)
    if believed.state is not TaskState.RUNNING or status.restarts <= (known or 0):
        return False, remembered
    if state is TaskState.RUNNING and known is None:
        return status.state in tables.ending, remembered
    return True, remembered


def requeue_reason(tables: StateTables, status: NativeStatus) -> str:
    # Without the scheduler's reason, its state says why (Slurm 25.11's EXPEDITING: the node
    # failed and the job goes first).
    told = tables.reasons.get(status.state) or "no reason given"
    why = status.reason if status.reason not in ("", "None") else told
    return f"requeued by {tables.kind} (restart {status.restarts}): {why}"


def ended(
    tables: StateTables,
    believed: Believed,
    status: NativeStatus,
    exit_doc: Mapping[str, Any] | None,
    now: float,
) -> Verdict:
    """Rule 2: the exit file decides, unless the scheduler ended the job (walltime, cancel,
    node). A job that ended by itself with no exit file is LOST once the grace period is over
    (no news until then: the file may still appear)."""
    state = tables.states[status.state]
    if exit_doc is None and status.state in tables.self_ended:
        exit_code = "" if status.exit_code is None else f", exit code {status.exit_code}"
        reason = (
            f"job {status.native_id} ended ({tables.kind} {status.state}{exit_code}) but the "
            f"runner wrote no exit file within {tables.lost_after_s:g} s: the runner was killed "
            f"hard, or its node failed; see the job's output in {believed.job_dir}"
        )
        return _lost_after_grace(tables, believed, reason, now)
    return Verdict(_ending(tables, believed, status, state, exit_doc), ended=True)


def _ending(
    tables: StateTables,
    believed: Believed,
    status: NativeStatus,
    state: TaskState,
    exit_doc: Mapping[str, Any] | None,
) -> Observation:
    if exit_doc is not None and state is TaskState.TIMEOUT:
        # The scheduler's limit came while the task ran. A task that exits on the limit's
        # SIGTERM may end before its runner has seen the signal, and the runner then writes
        # "completed": the scheduler's record decides, the exit code is the task's.
        code = observation_from_exit(exit_doc).exit_code
        return Observation(state, tables.reason(status) or "ran past its walltime", code)
    if exit_doc is not None and exit_doc.get("outcome") in RUNNER_OUTCOMES:
        return observation_from_exit(exit_doc)
    if exit_doc is None and status.state in tables.never_ran:
        return _never_ran(tables, believed, status)
    if exit_doc is not None and state is TaskState.COMPLETED:
        state = TaskState.FAILED  # the runner says the task was stopped: it did not complete
    code = exit_doc.get("exit_code") if exit_doc else status.exit_code
    reason = tables.reason(status) or f"the scheduler reports {status.state}"
    if exit_doc is None and state is not TaskState.CANCELLED:
        reason += f"; the runner wrote no exit file: see the job's output in {believed.job_dir}"
    preempted = status.state in tables.preempted or bool(
        exit_doc and exit_doc.get("outcome") == "preempted"
    )
    if status.state in tables.node_failed and tables.reruns_node_failures:
        return _node_failed(believed, reason, code)
    return Observation(state, reason, code, preempted=preempted)


def _node_failed(believed: Believed, reason: str, code: int | None) -> Observation:
    """The job's node failed and the pool leaves reruns to Klique: it goes again, a few
    times, as a job that never ran does."""
    if believed.attempts >= NEVER_RAN_TRIES:
        return Observation(
            TaskState.LOST, f"{reason}; its node failed in {believed.attempts} attempts", code
        )
    return Observation(TaskState.LOST, f"{reason}; run again by Klique", code, retry=True)


def _never_ran(tables: StateTables, believed: Believed, status: NativeStatus) -> Observation:
    """The job never ran: it goes again, like a job whose node failed, a few times."""
    reason = tables.reason(status) or f"the scheduler reports {status.state}"
    if believed.attempts >= NEVER_RAN_TRIES:
        return Observation(
            TaskState.LOST, f"{reason}; its job never ran in {believed.attempts} attempts"
        )
    return Observation(TaskState.LOST, f"{reason}; the job never ran", retry=True)


def _lost_after_grace(tables: StateTables, believed: Believed, reason: str, now: float) -> Verdict:
    """No news while the grace period lasts; LOST, for `reason`, once it is over."""
    over, since = out_of_grace(believed.missing_since, now, tables.lost_after_s)
    if not over:
        return Verdict(None, missing_since=since, restarts=believed.restarts)
    return Verdict(Observation(TaskState.LOST, reason), restarts=believed.restarts)


def left_queue(
    tables: StateTables, believed: Believed, record: NativeStatus | None, now: float
) -> Verdict:
    """A job gone from the queue with no exit file: the scheduler's accounting record decides
    where it has a final one; else LOST after the grace period (rule 3)."""
    state = tables.state(record) if record is not None else None
    if record is not None and state is not None and state.final:
        return ended(tables, believed, record, None, now)
    reason = (
        f"job {believed.native_id} left the queue with no exit file and no accounting "
        f"record for {tables.lost_after_s:g} s (killed hard, or its node failed)"
    )
    return _lost_after_grace(tables, believed, reason, now)


def confirmed(
    tables: StateTables,
    believed: Believed,
    exit_doc: Mapping[str, Any],
    record: NativeStatus | None,
    now: float,
) -> Verdict:
    """An exit file that names only a signal, for a job gone from the queue: the scheduler's
    accounting says who sent it (walltime, a cancel, else a failure). Without a record within
    the grace period, the exit file alone decides."""
    state = tables.state(record) if record is not None else None
    if record is not None and state is not None and state.final:
        return ended(tables, believed, record, exit_doc, now)
    over, since = out_of_grace(believed.missing_since, now, tables.lost_after_s)
    if not over:
        return Verdict(None, missing_since=since, restarts=believed.restarts)
    seen = observation_from_exit(exit_doc)
    reason = f"{seen.reason}; the scheduler's accounting has no record of the job"
    return Verdict(replace(seen, reason=reason), restarts=believed.restarts)


def missed(first_missed: float, looked_at: float, message_timeout_s: float) -> Observation | None:
    """Rule 4: no job carries the task's tag. A request whose reply was lost may still be
    inside the scheduler (Slurm's slurmctld works on it until MessageTimeout), so one look
    proves nothing: the task goes again only when a second look, taken at least the message
    timeout after the first, misses it too (None until then)."""
    if looked_at - first_missed < message_timeout_s:
        return None
    return Observation(
        TaskState.QUEUED,
        "no job carries its tag in two looks "
        f"{looked_at - first_missed:.0f} s apart after a submission whose "
        "outcome was unknown; submitting it again",
    )


def found_by_tag(
    tables: StateTables,
    tag: str,
    job_dir: str,
    listing: Iterable[NativeStatus],
    shows_script: bool,
) -> str | None:
    """The native id of the job that carries a task's tag (None: none does). The tag alone
    may be another installation's, or an earlier attempt's: where the scheduler shows the
    script, it must be this attempt's. A cancelled job is never taken for the task's."""
    scripts = (f"{job_dir}/job.sh",) if shows_script else ("", f"{job_dir}/job.sh")
    for status in listing:
        ours = status.name == tag and status.script in scripts
        if ours and tables.state(status) is not TaskState.CANCELLED:
            return status.native_id
    return None


def names_only_a_signal(exit_doc: Mapping[str, Any]) -> bool:
    """The runner saw only a signal: the scheduler's record says who sent it."""
    return exit_doc.get("outcome") not in (*RUNNER_OUTCOMES, PREEMPTED_MARKER)


def is_stranger(tables: StateTables, status: NativeStatus, submitting: Collection[str]) -> bool:
    """A live job named as Klique names jobs (a task's tag, an array's name), not one whose
    submission is being recorded (`submitting`: their names): reported, never cancelled."""
    if status.name in submitting:
        return False
    tagged = TAG.fullmatch(status.name) or ARRAY_NAME.fullmatch(status.name)
    return bool(tagged) and not tables.states.get(status.state, TaskState.RUNNING).final
