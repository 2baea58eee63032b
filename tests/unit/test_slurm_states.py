"""Slurm's states against scripted answers: CONFIGURING and SUSPENDED are phases of a running
task that the ledger does not charge unless the pool says so; BOOT_FAIL sends the task again;
an exit file that names only a signal is confirmed against Slurm's accounting."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_batch_status import Answer
from test_slurm_site_settings import poll, slurm_pool

from broker.domain import TaskState
from broker.pools.base import Observation
from broker.pools.slurm import SLURM_PHASES, SLURM_STATES
from broker.preview import sample_task
from broker.scheduler.link import StoreLink
from broker.store.repository import Store
from broker.transport import Completed


def test_every_phase_is_a_running_state_of_slurms_table():
    # squeue(1) "JOB STATE CODES": CF and S hold an allocation without running the script.
    assert SLURM_PHASES == {"CONFIGURING": "configuring", "SUSPENDED": "suspended"}
    assert all(SLURM_STATES[state] is TaskState.RUNNING for state in SLURM_PHASES)
    assert SLURM_STATES["BOOT_FAIL"] is TaskState.LOST


def squeue_showing(states: list[str]) -> Answer:
    """squeue answers job 11 in each of `states`, one per query, the last one from then on."""
    left = list(states)

    def answer(argv: list[str], account: str) -> Completed:
        if argv[0] == "squeue":
            state = left.pop(0) if len(left) > 1 else left[0]
            return Completed(0, f"11|klique-1|{state}|None|/jobs/klique-1/job.sh\n", "")
        if argv[:3] == ["scontrol", "show", "config"]:
            return Completed(0, "PrivateData = none\n", "")
        return Completed(0, "", "")

    return answer


def task_in(estate: Any, state: TaskState, attempts: int = 1) -> Any:
    task = sample_task(estate, "r", "alice")
    return replace(
        task, id=1, state=state, native_id="11", job_dir="/jobs/klique-1", attempts=attempts
    )


def test_nodes_booting_then_running_then_suspended_are_each_reported():
    driver, _, estate = slurm_pool(squeue_showing(["CONFIGURING", "RUNNING", "SUSPENDED"]))
    task = task_in(estate, TaskState.PENDING)
    booting = poll(driver, [task])[1]
    assert (booting.state, booting.phase, booting.charged) == (
        TaskState.RUNNING,
        "configuring",
        False,
    )
    assert "booting" in booting.reason
    running = poll(driver, [replace(task, state=TaskState.RUNNING)])[1]
    assert (running.phase, running.charged) == ("", True)  # same state, new phase: reported
    suspended = poll(driver, [replace(task, state=TaskState.RUNNING)])[1]
    assert (suspended.phase, suspended.charged) == ("suspended", False)
    assert "SUSPENDED" in suspended.reason
    assert poll(driver, [replace(task, state=TaskState.RUNNING)]) == {}  # nothing new


def test_a_pool_may_charge_a_phase():
    driver, _, estate = slurm_pool(squeue_showing(["SUSPENDED"]), ", charge_phases: [suspended]")
    seen = poll(driver, [task_in(estate, TaskState.RUNNING)])[1]
    assert (seen.phase, seen.charged) == ("suspended", True)


def test_an_unknown_phase_in_the_estate_is_refused():
    with pytest.raises(Exception, match="charge_phases"):
        slurm_pool(squeue_showing(["RUNNING"]), ", charge_phases: [pending]")


def test_boot_fail_sends_the_task_again_a_few_times():
    driver, _, estate = slurm_pool(squeue_showing(["BOOT_FAIL"]))
    seen = poll(driver, [task_in(estate, TaskState.PENDING)])[1]
    assert (seen.state, seen.retry) == (TaskState.LOST, True)
    assert "never ran" in seen.reason
    last = poll(driver, [task_in(estate, TaskState.PENDING, attempts=3)])[1]
    assert (last.state, last.retry) == (TaskState.LOST, False)
    assert "never ran in 3 attempts" in last.reason


SIGNALLED = {
    "/jobs/klique-1/exit.json": json.dumps(
        {"exit_code": 143, "outcome": "signalled", "reason": "terminated by SIGTERM"}
    ).encode()
}


def purged_with_accounting(state: str | None) -> Answer:
    """The job left squeue (MinJobAge); sacct (jobcomp) has it in `state`, or not at all."""

    def answer(argv: list[str], account: str) -> Completed:
        if argv[0] == "sacct":
            line = f"11|klique-1|{state}|0:15\n" if state else ""
            return Completed(0, line, "")
        if argv[:3] == ["scontrol", "show", "config"]:
            return Completed(0, "PrivateData = none\n", "")
        return Completed(0, "", "")

    return answer


# sacct(1) "JOB STATE CODES": who sent the signal the runner saw.
@pytest.mark.parametrize(
    ("slurm", "expected"),
    [
        ("TIMEOUT", TaskState.TIMEOUT),
        ("CANCELLED", TaskState.CANCELLED),
        ("CANCELLED by 1000", TaskState.CANCELLED),
        ("FAILED", TaskState.FAILED),
        ("COMPLETED", TaskState.FAILED),
        ("OUT_OF_MEMORY", TaskState.FAILED),
    ],
)
def test_a_signalled_exit_file_is_labelled_by_slurms_record(slurm, expected):
    driver, transport, estate = slurm_pool(purged_with_accounting(slurm), ", accounting: jobcomp")
    transport.files.update(SIGNALLED)
    seen = poll(driver, [task_in(estate, TaskState.RUNNING)])[1]
    assert seen.state is expected
    assert any(argv[0] == "sacct" for argv, _ in transport.calls)


def test_a_signalled_exit_file_waits_for_slurms_record_then_stands_alone():
    driver, transport, estate = slurm_pool(purged_with_accounting(None), ", accounting: jobcomp")
    transport.files.update(SIGNALLED)
    task = task_in(estate, TaskState.RUNNING)
    driver.lost_after_s = 3600.0
    assert poll(driver, [task]) == {}  # accounting may lag: wait
    driver.lost_after_s = 0.0
    seen = poll(driver, [task])[1]
    assert seen.state is TaskState.FAILED
    assert "no record of the job" in seen.reason


def test_without_accounting_a_signalled_exit_file_decides_at_once():
    driver, transport, estate = slurm_pool(purged_with_accounting(None))
    transport.files.update(SIGNALLED)
    seen = poll(driver, [task_in(estate, TaskState.RUNNING)])[1]
    assert seen.state is TaskState.FAILED
    assert not any(argv[0] == "sacct" for argv, _ in transport.calls)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(f"sqlite:///{tmp_path}/klique.db")


def placed_task(store: Store, estate: Any) -> Any:
    spec = sample_task(estate, "r", "alice").spec
    task = store.create_task(spec, "alice", None, gpus=1.0)
    store.change_state(task.id, TaskState.PLACED, pool="p")
    return store.change_state(task.id, TaskState.SUBMITTED, native_id="11", job_dir="/jobs/k")


def test_the_ledger_charges_only_the_running_phase(store):
    _, _, estate = slurm_pool(squeue_showing(["RUNNING"]))
    link = StoreLink(store, estate)
    task = placed_task(store, estate)
    phases = [
        Observation(TaskState.RUNNING, "booting", phase="configuring", charged=False),
        Observation(TaskState.RUNNING, "running"),
        Observation(TaskState.RUNNING, "suspended", phase="suspended", charged=False),
        Observation(TaskState.RUNNING, "running"),
        Observation(TaskState.COMPLETED, "done", 0),
    ]
    runs_after = []
    for seen in phases:
        asyncio.run(link.observed(store.get(task.id), seen))
        runs = store.ledger()
        runs_after.append((len(runs), sum(r.end is None for r in runs)))
    # booting: nothing; running: one open run; suspended: closed; running again: a second
    # run; done: both closed.
    assert runs_after == [(0, 0), (1, 1), (1, 0), (2, 1), (2, 0)]
    assert store.get(task.id).state is TaskState.COMPLETED


def test_a_boot_failure_puts_the_task_back_in_the_queue(store):
    _, _, estate = slurm_pool(squeue_showing(["RUNNING"]))
    link = StoreLink(store, estate)
    task = placed_task(store, estate)
    seen = Observation(TaskState.LOST, "its node failed to boot; the job never ran", retry=True)
    asyncio.run(link.observed(store.get(task.id), seen))
    again = store.get(task.id)
    assert again.state is TaskState.QUEUED and again.native_id is None
    assert "never ran; requeued" in again.reason
