"""Fair share: each team's GPU-seconds, with older use counting less (an exponential half-life)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class UsageRow:
    """One task's hold on GPUs, as the ledger records it.

    The task held `gpus` GPUs (a fraction counts as such) from `start` until `end`, or until
    now while `end` is None (still running). Times are seconds on the scheduler's clock.
    """

    team: str
    start: float
    end: float | None
    gpus: float


def decayed_usage(
    ledger_rows: Iterable[UsageRow], now: float, half_life_s: float
) -> dict[str, float]:
    """GPU-seconds per team, each second weighted by 2 ** -(its age / half_life_s).

    A GPU held for one half-life that ended just now counts half_life_s / ln 2 / 2 GPU-seconds;
    the same hold that ended one half-life ago counts half as much. Use after `now` is ignored.
    """
    if half_life_s <= 0:
        raise ValueError(f"half_life_s must be positive, not {half_life_s}")
    rate = math.log(2) / half_life_s
    usage: dict[str, float] = {}
    for row in ledger_rows:
        start = min(row.start, now)
        end = now if row.end is None else min(row.end, now)
        if end <= start or row.gpus <= 0:
            continue
        # The integral of gpus * exp(-rate * (now - t)) dt from start to end.
        weight = math.exp(-rate * (now - end)) - math.exp(-rate * (now - start))
        usage[row.team] = usage.get(row.team, 0.0) + row.gpus * weight / rate
    return usage
