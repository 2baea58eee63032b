"""Slurm's held and requeued states against captured squeue output and squeue(1): a job Slurm
requeued and holds shows the phase `held`, with Slurm's reason and what to do (what `klique
why` prints); EXPEDITING waits, REVOKED runs elsewhere; NODE_FAIL under `requeue: klique`
sends the task again."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from test_slurm_site_settings import poll, slurm_pool
from test_slurm_states import placed_task, squeue_lines, task_in

from broker.control.store_link import StoreLink
from broker.domain import TaskState
from broker.execution import Observation
from broker.pools.reconcile import HELD_PHASE
from broker.pools.slurm import SLURM_STATES, parse_squeue
from broker.scheduler.model import ActiveTask
from broker.scheduler.reasons import pool_queue_reasons

DATA = Path(__file__).parent.parent / "data" / "slurm"


def test_captured_requeue_holds_are_held_with_what_to_do():
    # `scontrol requeuehold 26` and `scontrol requeuehold state=SpecialExit 27` on Slurm 22.05.
    driver, _, estate = slurm_pool(squeue_lines(["RUNNING|None|0"]))
    held = parse_squeue((DATA / "squeue-requeue-held.txt").read_text())
    assert [(s.native_id, s.state) for s in held] == [("26", "PENDING"), ("27", "SPECIAL_EXIT")]
    for status in held:
        advice = driver.held(status)
        assert f"scontrol release {status.native_id}" in advice
        assert SLURM_STATES[status.state] is TaskState.PENDING


# squeue(1) "JOB STATE CODES" and slurmctld's state_desc (src/slurmctld/job_mgr.c).
@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("PENDING|job requeued in held state|1", "scontrol requeuehold"),
        ("SPECIAL_EXIT|job requeued in held state|1", "special-exit"),
        ("RESV_DEL_HOLD|Reservation|0", "reservation was deleted"),
        ("PENDING|user env retrieval failed requeued held|1", "login environment"),
        ("PENDING|launch failure limit exceeded requeued held|1", "max_batch_requeue"),
    ],
)
def test_a_held_job_shows_slurms_reason_and_what_to_do(line, words):
    driver, _, estate = slurm_pool(squeue_lines([line]))
    task = task_in(estate, TaskState.PENDING)
    seen = poll(driver, [task])[1]
    assert (seen.state, seen.phase, seen.charged) == (TaskState.PENDING, HELD_PHASE, False)
    assert words in seen.reason and "scontrol release 11" in seen.reason
    assert line.split("|")[1] in seen.reason or line.split("|")[0] in seen.reason
    assert poll(driver, [replace(task, reason=seen.reason)]) == {}  # reported once


def test_a_running_task_requeued_into_a_hold_goes_back_to_pending_held():
    driver, _, estate = slurm_pool(
        squeue_lines(["RUNNING|None|0", "SPECIAL_EXIT|job requeued in held state|1"])
    )
    task = task_in(estate, TaskState.RUNNING)
    poll(driver, [task])
    seen = poll(driver, [task])[1]
    assert (seen.state, seen.requeued, seen.phase) == (TaskState.PENDING, True, HELD_PHASE)
    assert seen.reason.startswith("requeued by slurm (restart 1): job requeued in held state; ")
    assert "scontrol release 11" in seen.reason


def test_an_ordinary_pending_job_is_not_held():
    driver, _, estate = slurm_pool(squeue_lines(["PENDING|Priority|0"]))
    seen = poll(driver, [task_in(estate, TaskState.SUBMITTED)])[1]
    assert (seen.state, seen.phase) == (TaskState.PENDING, "")


def test_expediting_waits_and_revoked_runs_on_another_cluster():
    # squeue(1), Slurm 25.11: EXPEDITING; REVOKED: this cluster's sibling of a federated job
    # that another cluster started.
    assert SLURM_STATES["EXPEDITING"] is TaskState.PENDING
    assert not SLURM_STATES["REVOKED"].final
    driver, _, estate = slurm_pool(squeue_lines(["REVOKED|None|0"]))
    seen = poll(driver, [task_in(estate, TaskState.PENDING)])[1]
    assert seen.state is TaskState.RUNNING and "another cluster" in seen.reason


@pytest.mark.parametrize(
    ("requeue", "again"), [("klique", True), ("slurm", False), ("none", False)]
)
def test_node_fail_is_run_again_by_klique_only_under_requeue_klique(requeue, again):
    driver, _, estate = slurm_pool(squeue_lines(["NODE_FAIL|NodeDown|0"]), requeue=requeue)
    seen = poll(driver, [task_in(estate, TaskState.RUNNING)])[1]
    assert (seen.state, seen.retry) == (TaskState.LOST, again)
    assert "its node failed" in seen.reason


def test_node_fail_under_requeue_klique_goes_again_a_few_times_only():
    driver, _, estate = slurm_pool(squeue_lines(["NODE_FAIL|NodeDown|0"]), requeue="klique")
    seen = poll(driver, [task_in(estate, TaskState.RUNNING, attempts=3)])[1]
    assert (seen.state, seen.retry) == (TaskState.LOST, False)
    assert "its node failed in 3 attempts" in seen.reason


def test_a_held_task_is_explained_by_klique_why(store):
    """The control plane keeps the held reason, and `klique why` (the pool's word for a task
    in its queue) prints it with what to do."""
    driver, _, estate = slurm_pool(
        squeue_lines(["RUNNING|None|0", "SPECIAL_EXIT|job requeued in held state|1"])
    )
    link = StoreLink(store, estate)
    task = placed_task(store, estate)
    asyncio.run(link.observed([(store.get(task.id), Observation(TaskState.RUNNING))]))
    listed = replace(store.get(task.id), native_id="11")
    poll(driver, [listed])
    news = poll(driver, [listed])
    asyncio.run(link.observed([(store.get(task.id), news[task.id])]))
    held = store.get(task.id)
    assert held.state is TaskState.PENDING and "scontrol release 11" in held.reason
    active = ActiveTask(held.id, held.owner, None, "r", "p", False, 0.0, native_reason=held.reason)
    word = pool_queue_reasons(estate, [active], set())[held.id].pools["p"]
    assert word.startswith("waiting in its queue (requeued by slurm (restart 1)")
    assert "special-exit" in word and "scontrol release 11" in word


def test_slurm_25_11s_expedited_requeue_is_told_as_slurms_testsuite_shows_it():
    # SchedMD's testsuite ("Expedited requeue", --requeue=expedite): a job whose node went down,
    # or whose Epilog failed after it failed, shows EXPEDITING and waits to run again; one that
    # failed on healthy nodes is requeued into REQUEUE_HOLD.
    driver, _, estate = slurm_pool(squeue_lines(["EXPEDITING|None|0"]))
    seen = poll(driver, [task_in(estate, TaskState.SUBMITTED)])[1]
    assert (seen.state, seen.phase) == (TaskState.PENDING, "")
    assert "Epilog" in seen.reason and "--requeue=expedite" in seen.reason
    driver, _, estate = slurm_pool(squeue_lines(["REQUEUE_HOLD|JobHeldUser|0"]))
    seen = poll(driver, [task_in(estate, TaskState.SUBMITTED)])[1]
    assert (seen.state, seen.phase) == (TaskState.PENDING, HELD_PHASE)
    assert "--requeue=expedite" in seen.reason and "scontrol release 11" in seen.reason


def test_a_running_task_whose_job_slurm_expedites_goes_back_to_pending_with_why():
    driver, _, estate = slurm_pool(squeue_lines(["RUNNING|None|0", "EXPEDITING|None|1"]))
    task = task_in(estate, TaskState.RUNNING)
    poll(driver, [task])
    seen = poll(driver, [task])[1]
    assert (seen.state, seen.requeued) == (TaskState.PENDING, True)
    assert seen.reason.startswith("requeued by slurm (restart 1): requeued ahead of other jobs")
