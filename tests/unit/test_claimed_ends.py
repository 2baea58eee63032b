"""When a pool is asked again for the ends runners claimed (broker/agents/timing.py: ClaimedEnds):
soon after a new claim, then less and less often while the same claims wait, never more often
than CONFIRM_S nor less often than the pool's interval."""

from broker.agents.timing import CONFIRM_S, ClaimedEnds


def test_without_claims_the_pool_is_looked_at_at_its_interval() -> None:
    claims = ClaimedEnds(interval_s=10.0)
    claims.seen(frozenset())
    assert claims.next_in() == 10.0
    assert claims.due_in(frozenset(), since_s=60.0) is None


def test_a_new_claim_is_looked_for_soon_and_a_waiting_one_less_and_less_often() -> None:
    claims = ClaimedEnds(interval_s=10.0)
    assert claims.due_in(frozenset({1}), since_s=CONFIRM_S / 2) != 0.0
    assert claims.due_in(frozenset({1}), since_s=CONFIRM_S) == 0.0
    claims.seen(frozenset({1}))  # the look did not see task 1's job end
    assert claims.next_in() == CONFIRM_S
    waits = []
    for _ in range(6):
        claims.seen(frozenset({1}))  # nor did the next ones
        waits.append(claims.next_in())
        assert claims.due_in(frozenset({1}), since_s=waits[-1] / 2) != 0.0
        assert claims.due_in(frozenset({1}), since_s=waits[-1]) == 0.0
    assert waits == [2 * CONFIRM_S, 4 * CONFIRM_S, 8 * CONFIRM_S, 10.0, 10.0, 10.0]
    # another task's claim: soon again
    assert claims.due_in(frozenset({1, 2}), since_s=CONFIRM_S) == 0.0
    claims.seen(frozenset({1, 2}))
    assert claims.next_in() == CONFIRM_S
    claims.seen(frozenset())  # both seen ended
    assert claims.next_in() == 10.0


def test_the_wait_for_a_claim_counts_from_the_last_query_not_from_the_claim() -> None:
    claims = ClaimedEnds(interval_s=10.0)
    assert claims.due_in(frozenset(), since_s=0.4) is None
    # a claim first seen 0.4 s after the last query is asked about 0.6 s later
    assert claims.due_in(frozenset({1}), since_s=0.4) == CONFIRM_S - 0.4
    assert claims.due_in(frozenset({1}), since_s=CONFIRM_S + 3) == 0.0
    claims.seen(frozenset({1}))  # asked about at that query: a second from it
    assert claims.due_in(frozenset({1}), since_s=0.5) == CONFIRM_S - 0.5
    claims.seen(frozenset({1}))  # and not seen ending: twice as long from the next
    assert claims.due_in(frozenset({1}), since_s=0.5) == 2 * CONFIRM_S - 0.5
