"""Slurm's states against scripted answers: CONFIGURING and SUSPENDED are phases of a running
task that the ledger does not charge unless the pool says so; BOOT_FAIL sends the task again;
an exit file that names only a signal is confirmed against Slurm's accounting."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest
from helpers.scripted_transport import Answer
from test_slurm_site_settings import poll, slurm_pool

from broker.control.store_link import StoreLink
from broker.domain import TaskState
from broker.execution import Observation
from broker.pools.slurm import SLURM_PHASES, SLURM_STATES, parse_squeue
from broker.preview import sample_task
from broker.store.repository import Store
from broker.transport import Completed


def test_every_phase_is_a_running_state_of_slurms_table():
    # squeue(1) "JOB STATE CODES": CF and S hold an allocation without running the script.
    assert SLURM_PHASES == {"CONFIGURING": "configuring", "SUSPENDED": "suspended"}
    assert all(SLURM_STATES[state] is TaskState.RUNNING for state in SLURM_PHASES)
    assert SLURM_STATES["BOOT_FAIL"] is TaskState.LOST


def squeue_showing(states: list[str]) -> Answer:
    """squeue answers job 11 in each of `states`, one per query, the last one from then on."""
    return squeue_lines([f"{state}|None|0" for state in states])


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
    driver, _, estate = slurm_pool(squeue_showing(["SUSPENDED"]), charge_phases=["suspended"])
    seen = poll(driver, [task_in(estate, TaskState.RUNNING)])[1]
    assert (seen.phase, seen.charged) == ("suspended", True)


def test_an_unknown_phase_in_the_estate_is_refused():
    with pytest.raises(Exception, match="charge_phases"):
        slurm_pool(squeue_showing(["RUNNING"]), charge_phases=["pending"])


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
    driver, transport, estate = slurm_pool(purged_with_accounting(slurm), accounting="jobcomp")
    transport.files.update(SIGNALLED)
    seen = poll(driver, [task_in(estate, TaskState.RUNNING)])[1]
    assert seen.state is expected
    assert any(argv[0] == "sacct" for argv, _ in transport.calls)


def test_a_signalled_exit_file_waits_for_slurms_record_then_stands_alone():
    driver, transport, estate = slurm_pool(purged_with_accounting(None), accounting="jobcomp")
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
        asyncio.run(link.observed([(store.get(task.id), seen)]))
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
    asyncio.run(link.observed([(store.get(task.id), seen)]))
    again = store.get(task.id)
    assert again.state is TaskState.QUEUED and again.native_id is None
    assert "never ran; requeued" in again.reason


def test_squeue_lines_carry_the_restart_count():
    # squeue --Format=JobID:|,Name:|,State:|,Reason:|,RestartCnt:|,Command: (Slurm 22.05)
    [new, none, old] = parse_squeue(
        "7|klique-1|PENDING|BeginTime|1|/jobs/a|b/job.sh\n"
        "8|klique-2|RUNNING|None|0|(null)\n"
        "9|klique-3|RUNNING|None|/jobs/c/job.sh\n"
    )
    assert (new.restarts, new.script, new.reason) == (1, "/jobs/a|b/job.sh", "BeginTime")
    assert (none.restarts, none.script) == (0, "")
    assert (old.restarts, old.script) == (None, "/jobs/c/job.sh")


def squeue_lines(lines: list[str], calls: list[list[str]] | None = None) -> Answer:
    """squeue answers job 11 with each line in turn (the last from then on); other commands
    are recorded in `calls` and succeed."""
    left = list(lines)

    def answer(argv: list[str], account: str) -> Completed:
        if argv[0] == "squeue":
            line = left.pop(0) if len(left) > 1 else left[0]
            return Completed(0, f"11|klique-1|{line}|/jobs/klique-1/job.sh\n", "")
        if argv[:3] == ["scontrol", "show", "config"]:
            return Completed(0, "PrivateData = none\n", "")
        if calls is not None and argv[0] != "sinfo":
            calls.append([*argv, account])
        return Completed(0, "", "")

    return answer


def test_only_a_grown_restart_count_moves_a_running_task_back_to_pending():
    answer = squeue_lines(["RUNNING|None|0", "PENDING|Priority|0", "PENDING|BeginTime|1"])
    driver, _, estate = slurm_pool(answer)
    task = task_in(estate, TaskState.RUNNING)
    assert poll(driver, [task]) == {}
    stale = poll(driver, [task])[1]  # a listing older than the runner's report
    assert (stale.state, stale.requeued) == (TaskState.PENDING, False)
    requeued = poll(driver, [task])[1]
    assert (requeued.state, requeued.requeued) == (TaskState.PENDING, True)
    assert requeued.reason == "requeued by slurm (restart 1): BeginTime"


@pytest.mark.parametrize(
    "after",
    [
        "COMPLETING|None|1",  # `scontrol requeue`: the old run still ends, the count grew already
        "RUNNING|None|1",  # requeued and started again between two listings
    ],
)
def test_a_requeue_seen_only_while_the_job_shows_running_still_moves_the_task_back(after):
    driver, _, estate = slurm_pool(squeue_lines(["RUNNING|None|0", after, "RUNNING|None|1"]))
    task = task_in(estate, TaskState.RUNNING)
    assert poll(driver, [task]) == {}
    requeued = poll(driver, [task])[1]
    assert (requeued.state, requeued.requeued) == (TaskState.PENDING, True)
    assert requeued.reason == "requeued by slurm (restart 1): no reason given"
    again = poll(driver, [replace(task, state=TaskState.PENDING)])[1]
    assert (again.state, again.requeued) == (TaskState.RUNNING, False)


def test_a_count_first_seen_running_is_remembered_not_taken_for_a_requeue():
    """The agent restarted: a job requeued before it is not requeued again now."""
    driver, _, estate = slurm_pool(squeue_lines(["RUNNING|None|2", "PENDING|Priority|2"]))
    task = task_in(estate, TaskState.RUNNING)
    assert poll(driver, [task]) == {}
    assert not poll(driver, [task])[1].requeued


def test_a_requeue_seen_at_the_first_listing_of_a_job_still_moves_the_task_back():
    """The runner reported running before any listing showed the job, then it was requeued:
    the first listing shows its old run ending with the grown count."""
    driver, _, estate = slurm_pool(squeue_lines(["COMPLETING|None|1"]))
    requeued = poll(driver, [task_in(estate, TaskState.RUNNING)])[1]
    assert (requeued.state, requeued.requeued) == (TaskState.PENDING, True)


def test_the_control_plane_moves_a_running_task_back_only_on_a_requeue(store):
    _, _, estate = slurm_pool(squeue_showing(["RUNNING"]))
    link = StoreLink(store, estate)
    task = placed_task(store, estate)
    asyncio.run(link.observed([(store.get(task.id), Observation(TaskState.RUNNING))]))
    stale = Observation(TaskState.PENDING, "pending in Slurm's queue")
    asyncio.run(link.observed([(store.get(task.id), stale)]))
    assert store.get(task.id).state is TaskState.RUNNING
    requeued = Observation(TaskState.PENDING, "requeued by slurm (restart 1): x", requeued=True)
    asyncio.run(link.observed([(store.get(task.id), requeued)]))
    again = store.get(task.id)
    assert (again.state, again.reason) == (TaskState.PENDING, "requeued by slurm (restart 1): x")
    assert [r.end is not None for r in store.ledger()] == [True]  # its run is closed


HELD = "PENDING|launch failed requeued held|1"


def test_a_job_held_after_a_failed_launch_is_released_once():
    calls: list[list[str]] = []
    driver, _, estate = slurm_pool(squeue_lines([HELD], calls))
    task = task_in(estate, TaskState.RUNNING)
    seen = poll(driver, [task])[1]
    assert seen.state is TaskState.PENDING and seen.requeued
    assert seen.reason == (
        "requeued by slurm (restart 1): launch failed requeued held; "
        "released by Klique (requeued_held: release)"
    )
    assert calls == [["scontrol", "release", "11", "alice"]]
    poll(driver, [replace(task, state=TaskState.PENDING)])
    assert len(calls) == 1  # the same hold is acted on once


def test_a_job_held_after_a_failed_launch_may_be_withdrawn():
    calls: list[list[str]] = []
    driver, _, estate = slurm_pool(squeue_lines([HELD], calls), requeued_held="withdraw")
    seen = poll(driver, [task_in(estate, TaskState.PENDING)])[1]
    assert (seen.state, seen.retry) == (TaskState.LOST, True)
    assert "withdrawn by Klique (requeued_held: withdraw)" in seen.reason
    assert calls == [["scancel", "11", "alice"]]


def test_an_operators_own_hold_is_left_alone():
    calls: list[list[str]] = []
    driver, _, estate = slurm_pool(squeue_lines(["PENDING|JobHeldAdmin|1"], calls))
    poll(driver, [task_in(estate, TaskState.PENDING)])
    assert calls == []


@pytest.mark.parametrize(("outcome", "code"), [("completed", 0), ("failed", 3)])
def test_slurms_timeout_decides_over_a_runner_that_missed_the_walltime_signal(outcome, code):
    """The task exited on Slurm's walltime SIGTERM before its runner saw the signal, so the
    runner wrote an ordinary ending: Slurm's TIMEOUT decides, the task's exit code stays."""
    driver, transport, estate = slurm_pool(squeue_lines(["TIMEOUT|TimeLimit|0"]))
    doc = {"exit_code": code, "outcome": outcome, "reason": f"exited with code {code}"}
    transport.files["/jobs/klique-1/exit.json"] = json.dumps(doc).encode()
    seen = poll(driver, [task_in(estate, TaskState.RUNNING)])[1]
    assert (seen.state, seen.exit_code) == (TaskState.TIMEOUT, code)
    assert "walltime" in seen.reason
