"""A `klique agent` reports to whichever replica answers: with replicas, its pool's state is
kept in the store, and the leader's placement reads it there (broker/store/pool_reports.py)."""

from __future__ import annotations

import time
from pathlib import Path

from broker.control.lease import Leadership
from broker.control.loop import ControlLoop
from broker.estate import parse_estate
from broker.execution import PoolState
from broker.store.leases import LeaseStore
from broker.store.repository import Store

ESTATE = """
resources:
  cpu: {profile: {cpus: 1, memory: 200M, walltime: 10m, pools: [far]}}
pools:
  far:
    kind: host
    agent: remote
    user_map: {alice: alice}
    job_root: /tmp
"""


def replica(store: Store, name: str, home: Path) -> ControlLoop:
    estate = parse_estate(ESTATE, "estate.yaml")
    leadership = Leadership(LeaseStore(store.engine), name)
    return ControlLoop(store, estate, {}, home, leadership=leadership)


def test_what_an_agent_told_a_follower_is_what_the_leader_places_by(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'k.db'}")
    follower, leader = replica(store, "b", tmp_path), replica(store, "a", tmp_path)
    assert leader.snapshots()["far"].reachable is False  # no report yet
    state = PoolState("far", reachable=True, free_gpus=0.0, free_slots=3, reason="")
    follower.published("far", state, {"4242"})
    seen = leader.snapshots()["far"]
    assert seen.reachable is True and seen.free_slots == 3
    assert leader.strangers("far") == {"4242"}
    # A report older than the one this replica holds never replaces it.
    leader.remote["far"].seen = time.time() + 60
    follower.published("far", PoolState("far", reachable=False, reason="old"), set())
    assert leader.snapshots()["far"].reachable is True
    store.close()
