"""The scheduler's lease (broker/control/lease.py): its rules at a given time, a leader that
cannot renew stops before its lease can end for others, and a stale leader's write is fenced."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from broker.control.lease import Leadership, acting_until, claim, readiness
from broker.domain import TaskSpec, TaskState
from broker.errors import Fenced
from broker.store.leases import LeaseRecord, LeaseStore, LeaseView
from broker.store.repository import Store

TTL = 8.0


def test_the_first_claim_takes_term_one_and_the_holder_renews_the_same_term() -> None:
    taken = claim(None, "a", None, 100.0, TTL)
    assert taken == LeaseRecord("a", 1, 108.0)
    assert claim(taken, "a", 1, 103.0, TTL) == LeaseRecord("a", 1, 111.0)


def test_another_replica_follows_until_the_lease_ends_then_takes_the_next_term() -> None:
    held = LeaseRecord("a", 4, 108.0)
    assert claim(held, "b", None, 107.9, TTL) is None
    assert claim(held, "b", None, 108.0, TTL) == LeaseRecord("b", 5, 116.0)


def test_a_replica_starting_again_under_its_own_id_takes_a_new_term_at_once() -> None:
    # Its old process may still run somewhere: the old term is fenced from now on.
    assert claim(LeaseRecord("a", 4, 108.0), "a", None, 101.0, TTL) == LeaseRecord("a", 5, 109.0)


def test_a_leader_whose_term_moved_on_does_not_renew_it() -> None:
    # "a" held term 4, another took 5 (then "a" took it again under 6, say): 4 is over.
    assert claim(LeaseRecord("b", 5, 108.0), "a", 4, 101.0, TTL) is None
    assert claim(LeaseRecord("a", 6, 108.0), "a", 4, 101.0, TTL) is None


def test_a_leader_stops_acting_before_its_lease_can_end_for_others() -> None:
    asked = 50.0  # on its own clock, before the database read its time
    assert acting_until(asked, TTL) < asked + TTL


class FrozenLeases:
    """A lease store whose database answers once, then never again (a cut network)."""

    def __init__(self) -> None:
        self.calls = 0
        self.cut = threading.Event()

    def claim(self, rule):  # noqa: ANN001, ANN201 (LeaseStore's)
        self.calls += 1
        if self.calls > 1:
            self.cut.wait(10)
            raise OSError("no answer")
        return LeaseView(rule(None, 1000.0), 1000.0)


def test_a_leader_cut_from_the_database_stops_before_its_lease_ends() -> None:
    ttl = 1.2
    leases = FrozenLeases()
    leadership = Leadership(leases, "a", ttl_s=ttl)  # type: ignore[arg-type]

    async def scenario() -> tuple[float, float]:
        stop = asyncio.Event()
        started = time.monotonic()
        claims = asyncio.create_task(leadership.run(stop))
        await asyncio.wait_for(leadership.gained.wait(), 2)
        assert leadership.leading() and leadership.term == 1
        await asyncio.wait_for(leadership.term_lost.wait(), 5)
        stopped = time.monotonic()
        stop.set()
        leases.cut.set()
        await claims
        return started, stopped

    started, stopped = asyncio.run(scenario())
    # The first claim was sent after `started`; others may take the lease at its end, no sooner.
    assert stopped < started + ttl
    assert not leadership.leading()


def test_a_stale_leaders_placement_is_refused_and_the_new_leaders_is_written(tmp_path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'k.db'}")
    leases = LeaseStore(store.engine)
    now = 1000.0  # the database's time, as the rules see it: a fake clock
    first = leases.claim(lambda row, _: claim(row, "a", None, now, TTL)).record
    assert first == LeaseRecord("a", 1, now + TTL)
    # "a" pauses past its lease; "b" takes the next term.
    later = now + TTL + 1
    second = leases.claim(lambda row, _: claim(row, "b", None, later, TTL)).record
    assert second == LeaseRecord("b", 2, later + TTL)
    task = store.create_task(TaskSpec(command=["true"], resource="cpu"), "alice", None)
    placed = {"pool": "p"}
    with pytest.raises(Fenced, match="term is now 2"):
        store.change_states(
            [task.id], TaskState.PLACED, "", [TaskState.QUEUED], {task.id: placed}, term=1
        )
    assert store.get(task.id).state is TaskState.QUEUED  # nothing of the stale write
    moved = store.change_states(
        [task.id], TaskState.PLACED, "", [TaskState.QUEUED], {task.id: placed}, term=2
    )
    assert [t.pool for t in moved] == ["p"]
    store.close()


def test_readiness_names_the_role_term_and_holder_and_says_when_the_store_does_not_answer() -> None:
    view = LeaseView(LeaseRecord("b", 7, 110.0), 104.0)
    assert readiness(view, "a", False) == {
        "ready": True,
        "store": "reachable",
        "replica": "a",
        "role": "follower",
        "term": 7,
        "holder": "b",
        "lease_left_s": 6.0,
    }
    down = readiness(None, "a", False)
    assert down["ready"] is False and down["store"] == "unreachable" and down["term"] is None
