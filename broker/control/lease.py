"""Which replica leads: the scheduler's lease, a row in the store with a fencing term, so that
two or more servers on one PostgreSQL run the placement cycle and the in-server pool agents
one at a time, and another takes over within the lease's time when the leader dies or is cut
from the database.

The rules are pure (`claim`, `acting_until`), with the database's time passed in; the store's
edge applies them in one locked transaction (broker/store/leases.py). `Leadership` runs them
on the server's event loop: it renews well before the lease ends, and a leader that cannot
renew stops acting at the lease's end less a margin, measured on its own monotonic clock from
before it asked, so that it has stopped before any other replica can take the lease. What a
leader writes to act on the estate carries its term, and the store refuses it once the term
has moved on (broker/store/leases.py's check_term): a replica that wakes from a long pause
cannot act on an old term."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from broker.store.leases import LeaseRecord, LeaseStore, LeaseView

log = logging.getLogger("klique.lease")

TTL_S = 8.0  # how long a lease holds unrenewed: a dead leader's successor starts within it
RENEW_PARTS = 4  # a leader renews this many times per lease
FOLLOW_PARTS = 8  # a follower asks this many times per lease (a dead leader is seen soon)
MARGIN_PARTS = 4  # a leader that could not renew stops this part of the lease before its end


def claim(
    current: LeaseRecord | None, me: str, held: int | None, now: float, ttl_s: float
) -> LeaseRecord | None:
    """What replica `me`, holding term `held` (None: none), makes of the lease `current` at the
    database's time `now`: the row to write, or None (another leads). In order:
    1. `me` holds it under term `held`: renewed, the same term, until now + ttl_s.
    2. No one holds it, its holder's time is over, or its holder is `me` starting again
       (holding no term): taken, the next term.
    3. Otherwise another replica leads: nothing changes."""
    if current is not None and current.holder == me and current.term == held:
        return LeaseRecord(me, current.term, now + ttl_s)
    if current is None:
        return LeaseRecord(me, 1, now + ttl_s)
    if now >= current.expires_at or (current.holder == me and held is None):
        return LeaseRecord(me, current.term + 1, now + ttl_s)
    return None


def _claim_as(
    me: str, held: int | None, ttl_s: float, current: LeaseRecord | None, now: float
) -> LeaseRecord | None:
    return claim(current, me, held, now, ttl_s)


def acting_until(asked_at: float, ttl_s: float) -> float:
    """Until when (this replica's monotonic clock) a leader whose claim was sent at `asked_at`
    may act: the lease ends for others no sooner than ttl_s after the database read its time,
    which was after `asked_at`; the margin covers an operation under way and the clocks'
    rates."""
    return asked_at + ttl_s - ttl_s / MARGIN_PARTS


@dataclass
class Leadership:
    """This replica's part in the lease: renews it, takes it when free, and says when this
    replica leads (`leading`, `gained`) and when it must stop (`term_lost`)."""

    leases: LeaseStore
    replica: str
    ttl_s: float = TTL_S
    term: int | None = None  # the term this replica leads under now; None: it follows
    seen: LeaseView | None = None  # the row as the last answered claim found it
    reachable: bool = False  # whether the last claim was answered
    until: float = 0.0  # monotonic: when a leader that has not renewed stops
    gained: asyncio.Event = field(default_factory=asyncio.Event)
    term_lost: asyncio.Event = field(default_factory=asyncio.Event)
    _failure: str = ""

    def leading(self) -> bool:
        return self.term is not None and time.monotonic() < self.until

    def current_term(self) -> int | None:
        """The term a leader's writes carry (fenced by the store); None when following."""
        return self.term

    async def run(self, stop: asyncio.Event) -> None:
        """Claim the lease at the leader's or the follower's pace until `stop`; never waits
        for the database past the moment this replica must stop acting."""
        while not stop.is_set():
            asked = time.monotonic()
            rule = functools.partial(_claim_as, self.replica, self.term, self.ttl_s)
            answer = asyncio.ensure_future(asyncio.to_thread(self.leases.claim, rule))
            while not answer.done() and not stop.is_set():
                await asyncio.wait([answer], timeout=self._left_s())
                self._stop_if_due()
            if answer.done():
                self._answered(answer, asked)
            await _wait(stop, self._next_claim_in(asked))

    def _left_s(self) -> float:
        """How long to wait for the database before looking at the clock again."""
        if self.term is None:
            return self.ttl_s / FOLLOW_PARTS
        return max(0.05, min(self.ttl_s / FOLLOW_PARTS, self.until - time.monotonic()))

    def _next_claim_in(self, asked: float) -> float:
        parts = RENEW_PARTS if self.term is not None else FOLLOW_PARTS
        return max(0.0, asked + self.ttl_s / parts - time.monotonic())

    def _answered(self, answer: asyncio.Future[LeaseView], asked: float) -> None:
        try:
            view = answer.result()
        except Exception as exc:  # the database did not answer: the margin protects the rest
            self.reachable = False
            if str(exc) != self._failure:
                log.warning("replica %s: the lease could not be claimed: %s", self.replica, exc)
                self._failure = str(exc)
            self._stop_if_due()
            return
        self.reachable, self._failure, self.seen = True, "", view
        record = view.record
        until = acting_until(asked, self.ttl_s)
        if record is not None and record.holder == self.replica and until > time.monotonic():
            if record.term != self.term:
                self._lead(record.term)
            self.until = until
        elif self.term is not None:
            self._follow("another replica holds the lease, or the answer came too late")

    def _lead(self, term: int) -> None:
        if self.term is not None:
            self._follow("a new term began")
        log.info("replica %s leads, term %d", self.replica, term)
        self.term = term
        self.term_lost = asyncio.Event()
        self.gained.set()

    def _stop_if_due(self) -> None:
        if self.term is not None and time.monotonic() >= self.until:
            self._follow("its lease could not be renewed in time")

    def _follow(self, why: str) -> None:
        log.warning("replica %s stops leading (term %s): %s", self.replica, self.term, why)
        self.term = None
        self.gained.clear()
        self.term_lost.set()

    async def release(self) -> None:
        """A clean stop: end this replica's term now, so that the next need not wait it out."""
        term, self.term = self.term, None
        self.term_lost.set()
        if term is None:
            return
        try:
            await asyncio.wait_for(asyncio.to_thread(self.leases.release, self.replica, term), 5)
        except Exception as exc:  # the lease then ends on its own
            log.warning("replica %s: could not release the lease: %s", self.replica, exc)


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    if seconds <= 0:
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


def readiness(view: LeaseView | None, replica: str | None, leading: bool) -> dict[str, Any]:
    """What /readyz says: whether the store answered (`view` None: it did not), this replica's
    role, and the lease's term, holder and time left. Replica ids only: nothing of the store's
    address, no token, no error text (which could name the database's host)."""
    record = view.record if view is not None else None
    return {
        "ready": view is not None,
        "store": "reachable" if view is not None else "unreachable",
        "replica": replica,
        "role": "leader" if leading else "follower",
        "term": record.term if record else None,
        "holder": record.holder if record else None,
        "lease_left_s": (
            round(max(0.0, record.expires_at - view.now), 1) if record and view else None
        ),
    }
