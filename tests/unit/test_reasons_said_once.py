"""Why a task waits, said once: every pending reason the scheduler gives, in every situation it
knows (no capacity, a pinned pool, a limit, a policy, a reclaim, a pool's own queue), reads as
one line in which no clause is repeated; `why`, `ls` and the UI all show that line."""

from __future__ import annotations

import re

import pytest
from test_placement import each_reason_cycle
from test_placement_policy import box_estate, run
from test_placement_policy import cycle as policy_cycle
from test_placement_policy import queued as team_queued

from broker.domain import Policy
from broker.scheduler.model import PendingCode, PendingReason, joined_reason


def repeated_clauses(line: str) -> list[str]:
    """The clauses of a reason (split at ':', ';' and '(') that appear more than once."""
    clauses = [c.strip(" )") for c in re.split(r"[:;(]", line) if c.strip(" )")]
    return sorted({c for c in clauses if clauses.count(c) > 1})


def said_once(reason: PendingReason) -> None:
    line = reason.text
    assert line.count(reason.primary.sentence) == 1, line
    assert repeated_clauses(line) == [], line
    assert "\n" not in line and line == line.strip(), line


def every_reason() -> dict[str, PendingReason]:
    """One pending reason of each kind the scheduler gives, from plain data."""
    out = each_reason_cycle()
    policies = [Policy("small", ("1-gpu",)), Policy("big", ("8-gpu",))]
    pinned = policy_cycle(
        box_estate(policies=policies),
        [team_queued(1, "big", resource="8-gpu"), team_queued(2, "small", at=9_999.0)],
        [run(i, "small") for i in range(4)],
        starvation_s=3600,
    )
    return {
        "no capacity": out.pending[2],
        "over its limit": out.pending[3],
        "not permitted": out.pending[4],
        "in no team": out.pending[5],
        "in the pool's queue": out.pending[7],
        "a pinned pool": pinned.pending[1],
        "kept for another": pinned.pending[2],
    }


@pytest.mark.parametrize("situation", sorted(every_reason()))
def test_each_pending_reason_says_its_sentence_once(situation: str) -> None:
    reason = every_reason()[situation]
    said_once(reason)


def test_the_reason_without_a_detail_is_the_sentence_alone() -> None:
    reason = every_reason()["no capacity"]
    assert reason.primary is PendingCode.NO_CAPACITY
    assert reason.text == "no pool in the profile can start it now"
    assert every_reason()["in the pool's queue"].text == "pending in the pool's own queue: in hpc"


@pytest.mark.parametrize(
    ("sentence", "detail", "line"),
    [
        ("no pool can start it", "", "no pool can start it"),
        ("no pool can start it", "no pool can start it", "no pool can start it"),
        (
            "no pool can start it",
            "no pool can start it; box is kept",
            "no pool can start it; box is kept",
        ),
        (
            "the team is at its limit",
            "team a's limit of 3",
            "the team is at its limit: team a's limit of 3",
        ),
    ],
)
def test_a_detail_that_restates_the_sentence_is_not_said_twice(
    sentence: str, detail: str, line: str
) -> None:
    assert joined_reason(sentence, detail) == line
    assert repeated_clauses(joined_reason(sentence, detail)) == []
