"""Deterministic crash points for the chaos suite: `KLIQUE_CRASH_AT=point:n` ends the process
with SIGKILL the n-th time it reaches `point`. Unset (always, outside tests), it does nothing.

Points: `after_submit` (the pool accepted a job, the store does not know it yet; reached once
per task of a batch, before the batch's record), `before_submit` (the task is PLACED, nothing
was sent; reached once per task of a batch, once all of them are begun), `after_poll` (a status
query answered, nothing was written).
"""

from __future__ import annotations

import os
import signal
from collections import Counter

_seen: Counter[str] = Counter()


def crash_point(point: str) -> None:
    wanted = os.environ.get("KLIQUE_CRASH_AT")
    if not wanted:
        return
    name, _, count = wanted.partition(":")
    if name != point:
        return
    _seen[point] += 1
    if _seen[point] == int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)
