"""broker/pools/reconcile.py on captured scheduler output: each row parses a real sample of
squeue, sacct, qstat or bjobs (tests/data/<scheduler>/) with the driver's own parser, takes one
job of it, and reconciles it against what Klique believes of the task, at a given time."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.domain import TaskState
from broker.pools import reconcile
from broker.pools.batch import BatchDriver
from broker.pools.lsf import LsfDriver, parse_bjobs_json
from broker.pools.native import NativeStatus
from broker.pools.pbs import PbsDriver
from broker.pools.pbs_parse import TORQUE_EXEC_CODES, parse_qstat_json, parse_qstat_text
from broker.pools.reconcile import HELD_PHASE, Believed
from broker.pools.slurm import SlurmDriver, held_advice, parse_sacct, parse_squeue

DATA = Path(__file__).parent.parent / "data"
GRACE_S = 120.0
NOW = 10_000.0
JOB_DIR = "/scratch/alice/klique/jobs/klique-7-1-0123456789ab"

# The runner's exit.json (docs/job-directory.md), as the batch driver reads it.
EXIT_FILES: dict[str, dict[str, Any] | None] = {
    "none": None,
    "completed": {"outcome": "completed", "exit_code": 0},
    "failed 3": {"outcome": "failed", "exit_code": 3, "reason": "exit code 3"},
    "signal": {"outcome": "signal", "exit_code": 143, "reason": "killed by SIGTERM"},
}

PARSERS: dict[str, Callable[[str], list[NativeStatus]]] = {
    "squeue": parse_squeue,
    "sacct": parse_sacct,
    "qstat json": parse_qstat_json,
    "torque qstat": lambda text: parse_qstat_text(text, TORQUE_EXEC_CODES),
    "bjobs json": parse_bjobs_json,
}

DRIVERS: dict[str, type[BatchDriver]] = {
    "squeue": SlurmDriver,
    "sacct": SlurmDriver,
    "qstat json": PbsDriver,
    "torque qstat": PbsDriver,
    "bjobs json": LsfDriver,
}


def sample(parser: str, name: str, native_id: str) -> NativeStatus:
    """One job of a captured listing, as the driver's parser reads it."""
    listing = PARSERS[parser]((DATA / name).read_text())
    [status] = [s for s in listing if s.native_id == native_id]
    return status


def tables(parser: str, charged: frozenset[str] = frozenset()) -> reconcile.StateTables:
    return DRIVERS[parser].state_tables(
        reruns_node_failures=False, charged=charged, lost_after_s=GRACE_S
    )


@dataclass(frozen=True)
class Row:
    parser: str
    sample: str
    native_id: str
    believed: TaskState
    exit_file: str
    expected: TaskState | None  # None: no news this look
    words: str = ""  # in the observation's reason
    missing_since: float | None = None  # when the job was first seen ended without exit file
    restarts: int | None = None  # the restart count last seen


LISTED = [
    # squeue(1): states of jobs in the queue, and ended ones still listed.
    Row("squeue", "slurm/squeue-mixed.txt", "5", TaskState.SUBMITTED, "none", TaskState.PENDING,
        "Resources"),
    Row("squeue", "slurm/squeue-mixed.txt", "1", TaskState.PENDING, "none", TaskState.RUNNING),
    Row("squeue", "slurm/squeue-mixed.txt", "4", TaskState.RUNNING, "completed",
        TaskState.COMPLETED, "exit code 0"),
    Row("squeue", "slurm/squeue-mixed.txt", "3", TaskState.RUNNING, "failed 3", TaskState.FAILED,
        "exit code 3"),
    # Ended by itself with no exit file: the file may still come, until the grace is over.
    Row("squeue", "slurm/squeue-mixed.txt", "4", TaskState.RUNNING, "none", None),
    Row("squeue", "slurm/squeue-mixed.txt", "4", TaskState.RUNNING, "none", None,
        missing_since=NOW - GRACE_S + 1),
    Row("squeue", "slurm/squeue-mixed.txt", "3", TaskState.RUNNING, "none", TaskState.LOST,
        "runner wrote no exit file within 120 s", missing_since=NOW - GRACE_S),
    # Cancelled by scancel: the scheduler ended it, no exit file needed.
    Row("squeue", "slurm/squeue-after-cancel.txt", "1", TaskState.RUNNING, "none",
        TaskState.CANCELLED),
    # A running task's job requeued and held: back to pending, in the phase `held`.
    Row("squeue", "slurm/squeue-requeue-held.txt", "26", TaskState.RUNNING, "none",
        TaskState.PENDING, "requeued by slurm (restart 1)", restarts=0),
    Row("squeue", "slurm/squeue-requeue-held.txt", "27", TaskState.PENDING, "none",
        TaskState.PENDING, "job requeued in held state", restarts=1),
    Row("squeue", "slurm/squeue-array.txt", "649_0", TaskState.SUBMITTED, "none",
        TaskState.RUNNING),
    # qstat -f -F json (PBS Professional): job_state and, once finished, Exit_status.
    Row("qstat json", "pbs/qstat_f_F_json_x.json", "4321.pbs01", TaskState.SUBMITTED, "none",
        TaskState.PENDING, "Insufficient amount of resource"),
    Row("qstat json", "pbs/qstat_f_F_json_x.json", "4323.pbs01", TaskState.PENDING, "none",
        TaskState.RUNNING),
    Row("qstat json", "pbs/qstat_f_F_json_x.json", "4325.pbs01", TaskState.RUNNING, "completed",
        TaskState.COMPLETED),
    Row("qstat json", "pbs/qstat_f_F_json_x.json", "4325.pbs01", TaskState.RUNNING, "none", None),
    Row("qstat json", "pbs/qstat_f_F_json_x.json", "4326.pbs01", TaskState.RUNNING, "signal",
        TaskState.TIMEOUT),
    Row("qstat json", "pbs/qstat_f_F_json_x.json", "4327.pbs01", TaskState.RUNNING, "signal",
        TaskState.CANCELLED),
    Row("qstat json", "pbs/qstat_f_F_json_x.json", "4329.pbs01", TaskState.RUNNING, "failed 3",
        TaskState.FAILED, "exit code 3"),
    # qstat -f -1 (Torque): C with exit_status.
    Row("torque qstat", "torque/qstat_f_1.txt", "2348.tq-head.cluster.example.org",
        TaskState.PENDING, "none", TaskState.RUNNING),
    Row("torque qstat", "torque/qstat_f_1.txt", "2350.tq-head.cluster.example.org",
        TaskState.RUNNING, "completed", TaskState.COMPLETED),
    Row("torque qstat", "torque/qstat_f_1.txt", "2350.tq-head.cluster.example.org",
        TaskState.RUNNING, "none", TaskState.LOST, "runner wrote no exit file",
        missing_since=NOW - 2 * GRACE_S),
    Row("torque qstat", "torque/qstat_f_1.txt", "2354.tq-head.cluster.example.org",
        TaskState.RUNNING, "failed 3", TaskState.FAILED),
    # bjobs -o ... -json (LSF): STAT, and EXIT with its TERM_ reason.
    Row("bjobs json", "lsf/bjobs_o_json_a.json", "5601", TaskState.SUBMITTED, "none",
        TaskState.PENDING, "Not enough GPU resources"),
    Row("bjobs json", "lsf/bjobs_o_json_a.json", "5603", TaskState.PENDING, "none",
        TaskState.RUNNING),
    Row("bjobs json", "lsf/bjobs_o_json_a.json", "5606", TaskState.RUNNING, "completed",
        TaskState.COMPLETED),
    Row("bjobs json", "lsf/bjobs_o_json_a.json", "5607", TaskState.RUNNING, "none", None),
    Row("bjobs json", "lsf/bjobs_o_json_a.json", "5607", TaskState.RUNNING, "none",
        TaskState.LOST, "(lsf EXIT, exit code 1)", missing_since=NOW - GRACE_S),
    Row("bjobs json", "lsf/bjobs_o_json_a.json", "5608", TaskState.RUNNING, "signal",
        TaskState.TIMEOUT),
    Row("bjobs json", "lsf/bjobs_o_json_a.json", "5609", TaskState.RUNNING, "signal",
        TaskState.CANCELLED),
]  # fmt: skip


def _believed(row: Row) -> Believed:
    return Believed(
        row.believed,
        job_dir=JOB_DIR,
        native_id=row.native_id,
        missing_since=row.missing_since,
        restarts=row.restarts,
    )


def _label(row: Row) -> str:
    return f"{row.sample}:{row.native_id}:{row.believed}:{row.exit_file}"


@pytest.mark.parametrize("row", LISTED, ids=_label)
def test_a_listed_job_is_read_against_what_klique_believes(row: Row) -> None:
    status = sample(row.parser, row.sample, row.native_id)
    advice = held_advice(status) if row.parser == "squeue" else ""
    verdict = reconcile.listed(
        tables(row.parser), _believed(row), status, EXIT_FILES[row.exit_file], NOW, advice
    )
    seen = verdict.observation
    if row.expected is None:
        assert seen is None
        # The grace period runs from the first look that missed the exit file.
        assert verdict.missing_since == (row.missing_since or NOW)
        return
    assert seen is not None and seen.state is row.expected, seen
    assert row.words in seen.reason
    assert verdict.missing_since is None  # read: nothing left to wait for


def test_a_requeued_held_job_is_pending_in_the_phase_held_and_not_charged() -> None:
    status = sample("squeue", "slurm/squeue-requeue-held.txt", "26")
    believed = Believed(TaskState.RUNNING, restarts=0)
    verdict = reconcile.listed(tables("squeue"), believed, status, None, NOW, held_advice(status))
    seen = verdict.observation
    assert seen is not None and (seen.state, seen.phase, seen.requeued) == (
        TaskState.PENDING,
        HELD_PHASE,
        True,
    )
    assert verdict.restarts == 1  # remembered: the next listing with 1 is no new requeue
    again = reconcile.listed(
        tables("squeue"), Believed(TaskState.PENDING, restarts=1), status, None, NOW, ""
    )
    assert again.observation is not None and not again.observation.requeued


@pytest.mark.parametrize(
    ("native_id", "charged", "expected"),
    [
        ("5604", frozenset(), False),
        ("5604", frozenset({"suspended"}), True),
        ("5603", frozenset(), True),
    ],
)
def test_a_suspended_job_is_charged_only_where_the_pool_says(
    native_id: str, charged: frozenset[str], expected: bool
) -> None:
    status = sample("bjobs json", "lsf/bjobs_o_json_a.json", native_id)
    verdict = reconcile.listed(
        tables("bjobs json", charged), Believed(TaskState.RUNNING), status, None, NOW
    )
    assert verdict.observation is not None and verdict.observation.charged is expected


GONE = [
    # sacct(1) for a job gone from the queue with no exit file.
    ("slurm/sacct-completion.txt", "1", None, TaskState.CANCELLED, ""),
    ("slurm/sacct-completion.txt", "3", NOW - GRACE_S, TaskState.LOST, "no exit file"),
    ("slurm/sacct-completion.txt", "3", None, None, ""),
    ("slurm/sacct-slurmdbd-exits.txt", "6", None, TaskState.CANCELLED, ""),
    # No record at all: LOST once the grace is over.
    ("slurm/sacct-completion.txt", "99", None, None, ""),
    ("slurm/sacct-completion.txt", "99", NOW - GRACE_S, TaskState.LOST, "no accounting record"),
]


@pytest.mark.parametrize(("name", "native_id", "since", "expected", "words"), GONE)
def test_a_job_that_left_the_queue_without_an_exit_file(
    name: str, native_id: str, since: float | None, expected: TaskState | None, words: str
) -> None:
    listing = {s.native_id: s for s in parse_sacct((DATA / name).read_text())}
    believed = Believed(
        TaskState.RUNNING, job_dir=JOB_DIR, native_id=native_id, missing_since=since
    )
    verdict = reconcile.left_queue(tables("sacct"), believed, listing.get(native_id), NOW)
    if expected is None:
        assert verdict.observation is None and verdict.missing_since == NOW
        return
    assert verdict.observation is not None and verdict.observation.state is expected
    assert words in verdict.observation.reason


@pytest.mark.parametrize(
    ("native_id", "since", "expected", "words"),
    [
        ("1", None, TaskState.CANCELLED, ""),  # sacct says who sent the signal: a cancel
        ("3", None, TaskState.FAILED, ""),
        ("99", None, None, ""),  # accounting may lag: wait
        ("99", NOW - GRACE_S, TaskState.FAILED, "no record of the job"),  # the file alone
    ],
)
def test_an_exit_file_naming_only_a_signal_is_checked_against_accounting(
    native_id: str, since: float | None, expected: TaskState | None, words: str
) -> None:
    listing = {
        s.native_id: s for s in parse_sacct((DATA / "slurm/sacct-completion.txt").read_text())
    }
    believed = Believed(
        TaskState.RUNNING, job_dir=JOB_DIR, native_id=native_id, missing_since=since
    )
    signal: Mapping[str, Any] = EXIT_FILES["signal"] or {}
    verdict = reconcile.confirmed(tables("sacct"), believed, signal, listing.get(native_id), NOW)
    if expected is None:
        assert verdict.observation is None
        return
    assert verdict.observation is not None and verdict.observation.state is expected
    assert words in verdict.observation.reason


@pytest.mark.parametrize(
    ("first", "looked", "expected"),
    [(NOW, NOW, None), (NOW, NOW + 9.9, None), (NOW, NOW + 10, TaskState.QUEUED)],
)
def test_a_lost_submission_goes_again_only_after_two_looks_a_message_timeout_apart(
    first: float, looked: float, expected: TaskState | None
) -> None:
    seen = reconcile.missed(first, looked, message_timeout_s=10.0)
    assert (seen.state if seen else None) is expected


@pytest.mark.parametrize(
    ("tag", "shows_script", "script_dir", "expected"),
    [
        ("klique-105", False, JOB_DIR, "5"),  # squeue without the script: the tag decides
        ("klique-105", True, JOB_DIR, None),  # with it: another attempt's, or a --wrap
        ("klique-101", False, JOB_DIR, "1"),
        ("klique-999", False, JOB_DIR, None),
    ],
)
def test_a_job_is_found_by_its_tag(
    tag: str, shows_script: bool, script_dir: str, expected: str | None
) -> None:
    listing = parse_squeue((DATA / "slurm/squeue-mixed.txt").read_text())
    found = reconcile.found_by_tag(tables("squeue"), tag, script_dir, listing, shows_script)
    assert found == expected


def test_a_cancelled_job_is_never_taken_for_the_tasks() -> None:
    listing = parse_squeue((DATA / "slurm/squeue-after-cancel.txt").read_text())
    assert reconcile.found_by_tag(tables("squeue"), "klique-101", JOB_DIR, listing, False) is None


@pytest.mark.parametrize(
    ("since", "now", "over"),
    [(None, NOW, False), (NOW - GRACE_S + 1, NOW, False), (NOW - GRACE_S, NOW, True)],
)
def test_the_grace_period_runs_from_the_first_miss(
    since: float | None, now: float, over: bool
) -> None:
    assert reconcile.out_of_grace(since, now, GRACE_S) == (over, since or now)
