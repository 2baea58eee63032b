"""A brake on password guessing: failures per key (a user name, a source address) in a
sliding window, kept in a table of bounded size, so that a flood of distinct names or
addresses costs the server a fixed amount of memory."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable


class Throttle:
    """At most `limit` failures per key in `window_s` seconds; `wait` says how long a key must
    wait before it may try again. `take` counts a try as a failure before it is made and
    `forgive` takes it back once it succeeds, so that tries made at once cannot all pass the
    check before the first of them fails.

    The table holds at most `size` keys, least recently failed first: a key whose last failure
    left the window is dropped as soon as it reaches the front, and when the table is full the
    least recently failed key makes room. Each key keeps at most `limit` times."""

    def __init__(
        self,
        limit: int,
        window_s: float,
        size: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window_s = window_s
        self.size = size
        self._clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def wait(self, key: str) -> float:
        """Seconds before `key` may try again: 0 when it may now."""
        with self._lock:
            return self._wait(key, self._clock())

    def _wait(self, key: str, now: float) -> float:
        self._expire(now)
        times = self._failures.get(key)
        if times is None or len(times) < self.limit:
            return 0.0
        # Full: the oldest failure in the window frees a try when it leaves it.
        return max(0.0, times[0] + self.window_s - now)

    def take(self, key: str) -> float:
        """Count a try for `key` now, as a failure until it is forgiven, and answer 0; or,
        when `key` must wait, count nothing and answer the seconds to wait."""
        with self._lock:
            wait = self._wait(key, self._clock())
            if not wait:
                self._add(key, self._clock())
            return wait

    def forgive(self, key: str) -> None:
        """Take back `key`'s latest try (it succeeded, or could not be made)."""
        with self._lock:
            times = self._failures.get(key)
            if times:
                times.pop()
            if times is not None and not times:
                del self._failures[key]

    def add(self, key: str) -> None:
        """One more failure for `key`, now."""
        with self._lock:
            self._add(key, self._clock())

    def _add(self, key: str, now: float) -> None:
        self._expire(now)
        times = self._failures.pop(key, None)
        if times is None:
            times = deque(maxlen=self.limit)
        times.append(now)
        self._failures[key] = times  # to the back: the most recently failed
        while len(self._failures) > self.size:
            self._failures.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._failures)

    def _expire(self, now: float) -> None:
        """Drop, from the front, keys whose last failure left the window. The table is in
        order of last failure, so the first key still in the window ends the sweep."""
        while self._failures:
            key, times = next(iter(self._failures.items()))
            if now - times[-1] < self.window_s:
                return
            del self._failures[key]


def retry_after(wait_s: float) -> str:
    """A Retry-After header's value (whole seconds, at least 1) for a wait."""
    return str(max(1, math.ceil(wait_s)))
