"""One pool's timing, owned by its agent alone: how long the agent rests between looks, when
the pool's scheduler is asked for its jobs next (at the pool's poll interval, with jitter,
backing off while it fails), and how soon an end a runner claimed is asked about.

Pure: every method is given the time (monotonic seconds), so the rules are tested with a
number, not a clock. A driver only says how often its pool may be asked
(`PoolDriver.query_interval_s`) and answers when asked.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

MAX_BACKOFF = 16  # times an interval, while failures last
JITTER = (0.9, 1.1)  # a query's interval is drawn in this band: pools' queries do not line up

CONFIRM_S = 1.0  # a claimed end is looked for this soon after it is first seen


@dataclass
class ClaimedEnds:
    """When to look again for the ends runners claimed. A runner reports its end just before
    its job ends, and the end is final only once the pool has seen it: so the pool is asked
    again soon after a new claim, rather than at its interval, then twice as late each time
    while the same claims wait (a job slow to leave), up to the interval."""

    interval_s: float
    waiting: frozenset[int] = frozenset()  # the claims the last look did not confirm
    wait_s: float = CONFIRM_S

    def seen(self, waiting: frozenset[int]) -> None:
        """What a look left unconfirmed."""
        fresh = waiting - self.waiting
        self.wait_s = CONFIRM_S if fresh else min(self.wait_s * 2, self.interval_s)
        self.waiting = waiting

    def due_in(self, claimed: frozenset[int], since_s: float) -> float | None:
        """How long after a look `since_s` after the last one the pool is to be asked early for
        these (0.0: now; None: no claim to ask about)."""
        if not claimed:
            return None
        return max(0.0, (CONFIRM_S if claimed - self.waiting else self.wait_s) - since_s)

    def next_in(self) -> float:
        """The wait before the next look."""
        return min(self.wait_s, self.interval_s) if self.waiting else self.interval_s


@dataclass
class PoolClock:
    """When to look at a pool, and when a look asks its scheduler.

    Two backoffs, for two different silences: the agent's looks back off while a look fails
    (the pool, or the control plane of `klique agent`); the pool's status query backs off
    while the query itself fails, and while it does no claimed end hurries it.
    """

    look_s: float  # the rest between looks with nothing to do
    query_s: float | None = None  # the pool's poll interval; None: ask at every look
    look_backoff: int = 1
    query_backoff: int = 1
    next_query: float = 0.0  # when the next status query is due (without a claim)
    queried_at: float = 0.0  # when the last status query began
    claims: ClaimedEnds = field(init=False)

    def __post_init__(self) -> None:
        self.claims = ClaimedEnds(self.query_s or self.look_s)

    def query_due(self, claimed: frozenset[int], now: float) -> bool:
        """Whether the look at `now` asks the pool: at every look where it has no interval;
        else once its interval has passed, or sooner for an end runners claimed (`claimed`:
        the tasks followed whose runner claims an end)."""
        if self.query_s is None:
            return True
        return now >= self.next_query or self.confirm_in(claimed, now) == 0.0

    def confirm_in(self, claimed: frozenset[int], now: float) -> float | None:
        """Seconds until the pool may be asked about these claimed ends (None: a look asks
        anyway, or the pool is being waited out)."""
        if self.query_s is None or self.query_backoff != 1:
            return None
        return self.claims.due_in(claimed, now - self.queried_at)

    def queried(self, claimed: frozenset[int], now: float) -> None:
        """A status query begins at `now`, with these claims before it."""
        self.queried_at = now
        self.claims.seen(claimed)

    def answered(self) -> None:
        """The query that began at `queried_at` answered: the next one comes an interval on."""
        self.query_backoff = 1
        self._schedule()

    def unanswered(self) -> None:
        """The pool did not answer the query: it is asked twice as late each time, up to
        MAX_BACKOFF intervals."""
        self.query_backoff = min(self.query_backoff * 2, MAX_BACKOFF)
        self._schedule()

    def _schedule(self) -> None:
        if self.query_s is not None:
            interval = self.query_s * self.query_backoff
            self.next_query = self.queried_at + interval * random.uniform(*JITTER)

    def look_failed(self) -> None:
        self.look_backoff = min(self.look_backoff * 2, MAX_BACKOFF)

    def look_answered(self) -> None:
        self.look_backoff = 1

    def next_look_in(self, unconfirmed: frozenset[int], now: float) -> float:
        """The rest before the next look: backed off while looks fail; otherwise the look
        interval, and no longer than until the pool may be asked about the claims the last look
        left unconfirmed (a second after its last query, not a second after this look)."""
        if self.look_backoff > 1:
            return self.look_s * self.look_backoff
        soon = self.confirm_in(unconfirmed, now)
        return self.look_s if soon is None else min(self.look_s, soon)
