"""One pool's timing, kept by its agent alone (broker/agents/timing.py: PoolClock): the status
query at the pool's interval with jitter, backed off while it fails and hurried by claimed ends
only while it answers; the agent's looks backed off while they fail; and both kinds of agent,
the server's and `klique agent`'s, built by one factory (broker/agents/factory.py)."""

from __future__ import annotations

import pytest

from broker.agents.factory import REMOTE_LOOK_S, build_agent, look_interval_s
from broker.agents.timing import CONFIRM_S, JITTER, MAX_BACKOFF, PoolClock
from broker.estate import parse_estate

NOTHING: frozenset[int] = frozenset()


def asked(clock: PoolClock, now: float, claimed: frozenset[int] = NOTHING) -> bool:
    """A look at `now` as the agent makes it: True where it asked the pool (which answered)."""
    if not clock.query_due(claimed, now):
        return False
    clock.queried(claimed, now)
    clock.answered()
    return True


def test_a_pool_without_an_interval_is_asked_at_every_look() -> None:
    clock = PoolClock(look_s=0.5)
    assert all(asked(clock, 100.0 + step * 0.01) for step in range(10))
    assert clock.next_look_in(frozenset({1}), 100.0) == 0.5  # claims never hurry its looks


def test_the_query_comes_once_per_interval_within_its_jitter() -> None:
    clock = PoolClock(look_s=0.5, query_s=10.0)
    times = [step * 0.5 for step in range(400)]  # 200 s of looks
    queries = [now for now in times if asked(clock, now)]
    gaps = [b - a for a, b in zip(queries, queries[1:], strict=False)]
    low, high = JITTER
    assert gaps and all(10.0 * low <= gap <= 10.0 * high + 0.5 for gap in gaps), gaps


def test_a_failing_query_backs_off_and_claims_do_not_hurry_it() -> None:
    clock = PoolClock(look_s=0.5, query_s=10.0)
    for expected in (2, 4, 8, 16, MAX_BACKOFF):
        assert clock.query_due(NOTHING, clock.next_query)
        clock.queried(NOTHING, clock.next_query)
        clock.unanswered()
        assert clock.query_backoff == expected
    assert clock.next_query - clock.queried_at >= 10.0 * MAX_BACKOFF * JITTER[0]
    soon = clock.queried_at + CONFIRM_S
    assert clock.confirm_in(frozenset({1}), soon) is None  # a silent pool is waited out
    assert not clock.query_due(frozenset({1}), soon)
    clock.queried(NOTHING, clock.next_query)
    clock.answered()
    assert clock.query_backoff == 1
    assert clock.confirm_in(frozenset({1}), clock.queried_at) == CONFIRM_S


def test_a_claimed_end_is_asked_about_a_second_after_the_last_query() -> None:
    clock = PoolClock(look_s=2.0, query_s=60.0)
    assert asked(clock, 1000.0)
    assert clock.next_look_in(NOTHING, 1000.0) == 2.0
    assert clock.next_look_in(frozenset({1}), 1000.4) == pytest.approx(CONFIRM_S - 0.4)
    assert not asked(clock, 1000.4, frozenset({1}))  # too soon after the last query
    assert asked(clock, 1000.0 + CONFIRM_S, frozenset({1}))
    # Unconfirmed, the same claim is asked about twice as late each time.
    assert clock.confirm_in(frozenset({1}), clock.queried_at) == pytest.approx(CONFIRM_S)
    assert asked(clock, clock.queried_at + CONFIRM_S, frozenset({1}))
    assert clock.confirm_in(frozenset({1}), clock.queried_at) == pytest.approx(2 * CONFIRM_S)


def test_failing_looks_rest_longer_and_a_good_look_resets_them() -> None:
    clock = PoolClock(look_s=0.5, query_s=10.0)
    for _ in range(6):
        clock.look_failed()
    assert clock.next_look_in(NOTHING, 0.0) == 0.5 * MAX_BACKOFF
    assert clock.query_backoff == 1  # the pool's queries answer none the less
    clock.look_answered()
    assert clock.next_look_in(NOTHING, 0.0) == 0.5


ESTATE = """
resources:
  r: {profile: {pools: [batch, host], cpus: 1, walltime: 1h}}
pools:
  batch: {kind: slurm, job_root: /jobs, poll_interval: 3s, submit_concurrency: 5}
  host: {kind: host}
"""


class Driver:
    """What the factory reads of a driver."""

    def __init__(self, query_interval_s: float | None) -> None:
        self.query_interval_s = query_interval_s


def test_one_factory_builds_the_servers_agents_and_klique_agents() -> None:
    estate = parse_estate(ESTATE, "estate.yaml")
    batch, host = estate.pools["batch"], estate.pools["host"]
    assert look_interval_s(batch, 0.5) == 0.5  # the server looks at least every half second
    assert look_interval_s(batch, 10.0) == 3.0  # and never rests past the poll interval
    assert look_interval_s(host, REMOTE_LOOK_S) == REMOTE_LOOK_S
    driver = Driver(3.0)
    agent = build_agent(batch, driver, link=None, most_s=REMOTE_LOOK_S)  # type: ignore[arg-type]
    assert (agent.name, agent.interval_s) == ("batch", REMOTE_LOOK_S)
    assert (agent.clock.look_s, agent.clock.query_s) == (REMOTE_LOOK_S, 3.0)
    assert agent.submit_concurrency == 5
