"""The task service used directly, as every adapter uses it (no HTTP): create, list with
filters, why, cancel, on a SQLite store in a temporary folder under a real control loop
(no pool drivers: tasks wait in the queue, and placement says why)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.estates import estate, profile

from broker.control.loop import ControlLoop
from broker.domain import TaskState
from broker.errors import KliqueError, NotFound, NotPermitted, TooLarge
from broker.identity.resolve import Caller
from broker.store.repository import Store
from broker.tasks.batches import BatchItem
from broker.tasks.schemas import SubmitRequest
from broker.tasks.service import TaskService

ALICE = Caller("alice", False, team="vision")
BOB = Caller("bob", False, team="vision")
CAROL = Caller("carol", False, team="audio")
ADMIN = Caller("root", True)


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[ControlLoop]:
    store = Store.open(f"sqlite:///{tmp_path / 'k.db'}")
    pool = {"kind": "slurm", "job_root": "/jobs", "user_map": {"alice": "alice", "bob": "bob"}}
    site = estate(
        teams={"vision": ["alice", "bob"], "audio": ["carol"]},
        resources={
            "small": profile("p", cpus=1, walltime="1m"),
            "big": profile("p", cpus=2, walltime="1m"),
        },
        pools={"p": pool},
        policies={"vision": {"resources": ["small"]}},
        limits={"max_diff": 1},  # MiB
    )
    yield ControlLoop(store, site, {}, tmp_path)
    store.close()


@pytest.fixture
def tasks(loop: ControlLoop) -> TaskService:
    return TaskService(loop)


def submit(tasks: TaskService, who: Caller, **body: object) -> int:
    request = SubmitRequest.model_validate({"command": ["true"], "resource": "small", **body})
    return asyncio.run(tasks.submit(who, request)).id


def test_a_submit_queues_one_task_of_the_callers_own(tasks: TaskService) -> None:
    task_id = submit(tasks, ALICE, name="train", project="cats")
    shown = tasks.show(ALICE, task_id)
    assert (shown.owner, shown.name, shown.project) == ("alice", "train", "cats")
    assert shown.state is TaskState.QUEUED
    assert [e["to"] for e in shown.events][-1] == "queued"


def test_a_submit_the_estate_would_never_run_is_refused_with_its_kind(
    tasks: TaskService,
) -> None:
    with pytest.raises(NotFound, match="unknown compute resource 'huge'"):
        submit(tasks, ALICE, resource="huge")
    with pytest.raises(NotPermitted, match="team vision may not use compute resource 'big'"):
        submit(tasks, ALICE, resource="big")
    diff = {"repo": "https://example.org/r.git", "commit": "a" * 40, "diff": "x" * (1 << 20) + "x"}
    with pytest.raises(TooLarge, match="over this server's limit of 1048576"):
        submit(tasks, ALICE, code=diff)
    assert tasks.listing(ADMIN, all_users=True) == []


def test_a_listing_shows_the_callers_own_newest_first_and_filters(tasks: TaskService) -> None:
    first = submit(tasks, ALICE, project="cats")
    second = submit(tasks, ALICE, project="dogs")
    theirs = submit(tasks, BOB, project="cats")
    tasks.store.change_state(first, TaskState.CANCELLED, "test", only_from=[TaskState.QUEUED])
    assert [t.id for t in tasks.listing(ALICE)] == [second, first]
    assert [t.id for t in tasks.listing(ALICE, all_users=True)] == [second, first]  # not admin
    assert [t.id for t in tasks.listing(ADMIN, all_users=True)] == [theirs, second, first]
    assert [t.id for t in tasks.listing(ALICE, states="queued")] == [second]
    assert [t.id for t in tasks.listing(ALICE, states="queued,cancelled")] == [second, first]
    assert [t.id for t in tasks.listing(ADMIN, all_users=True, project="cats")] == [theirs, first]
    assert [t.id for t in tasks.listing(ALICE, limit=1)] == [second]
    assert [t.id for t in tasks.listing(ALICE, before=second)] == [first]
    with pytest.raises(KliqueError, match="unknown states bogus; use any of"):
        tasks.listing(ALICE, states="queued,bogus")


def test_why_a_queued_task_waits_is_placements_reason(
    tasks: TaskService, loop: ControlLoop
) -> None:
    task_id = submit(tasks, ALICE)
    asyncio.run(loop.cycle())  # no driver for pool p: placement says why the task waits
    why = tasks.why(ALICE, task_id)
    assert why.waiting and why.state is TaskState.QUEUED
    assert why.primary and why.sentence and why.reason
    assert tasks.show(ALICE, task_id).reason == why.reason
    assert tasks.why(BOB, task_id).reason == why.reason  # her teammate reads it
    with pytest.raises(NotFound):
        tasks.why(CAROL, task_id)  # another team: as if it did not exist


def test_a_cancel_by_another_user_is_refused_and_changes_nothing(tasks: TaskService) -> None:
    task_id = submit(tasks, ALICE)
    with pytest.raises(NotFound, match=f"no task {task_id}"):
        asyncio.run(tasks.cancel(CAROL, task_id))
    with pytest.raises(NotPermitted, match="only its owner and admins may cancel it"):
        asyncio.run(tasks.cancel(BOB, task_id))  # a teammate reads it, but cannot cancel
    assert tasks.show(ALICE, task_id).state is TaskState.QUEUED
    cancelled = asyncio.run(tasks.cancel(ALICE, task_id))
    assert cancelled.state is TaskState.CANCELLED
    again = asyncio.run(tasks.cancel(ADMIN, task_id))  # an ended task stays as it ended
    assert again.state is TaskState.CANCELLED


def test_a_batch_is_made_whole_or_not_at_all(tasks: TaskService) -> None:
    good = BatchItem.model_validate({"command": ["true"], "resource": "small"})
    bad = BatchItem.model_validate({"command": ["true"], "resource": "big"})
    with pytest.raises(NotPermitted, match=r"1 of 2 fail: tasks\[1\].resource"):
        tasks.create_many(ALICE, [good, bad], "sweep")
    assert tasks.listing(ALICE) == []
    made = tasks.create_many(ALICE, [good, good], "sweep")
    assert made.sweep is not None and len(made.tasks) == 2
    assert (tasks.sweep(ALICE, made.sweep).size, tasks.sweep(ADMIN, made.sweep).name) == (
        2,
        "sweep",
    )
    with pytest.raises(NotFound, match="no sweep"):
        tasks.sweep(CAROL, made.sweep)
