"""A tuning's budget: trials, GPU-hours and wall time, and what the tuner does when one is spent.
Pure: the tuner hands in what it counted (broker/tasks/tuner.py).

The rules, in order:
1. Trials: once `trials` have been asked, no more are asked; those running finish.
2. GPU-hours (the ledger's metering of the trials, running ones to now) and wall time: once
   either is spent, no more are asked and the trials still running are cancelled, since every
   second more is spent past the budget.
3. Otherwise, as many new trials are asked as keep `concurrency` running, within the trials left.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    trials: int
    gpu_hours: float | None = None  # None: no bound
    max_time_s: float | None = None
    concurrency: int = 1


@dataclass(frozen=True)
class Spent:
    """What a tuning has used so far."""

    asked: int  # trials made
    live: int  # trials not yet ended
    gpu_seconds: float
    elapsed_s: float


@dataclass(frozen=True)
class Verdict:
    ask: int  # how many new trials to ask now
    stop_live: bool  # cancel the trials still running
    spent: str | None  # which budget is spent, in words; None: none yet


def judge(budget: Budget, spent: Spent) -> Verdict:
    """What to do next under `budget` (the rules in the module's docstring)."""
    if budget.max_time_s is not None and spent.elapsed_s >= budget.max_time_s:
        return Verdict(0, True, f"spent its wall time of {_duration(budget.max_time_s)}")
    if budget.gpu_hours is not None and spent.gpu_seconds >= budget.gpu_hours * 3600:
        return Verdict(0, True, f"spent its {budget.gpu_hours:g} GPU-hours")
    if spent.asked >= budget.trials:
        return Verdict(0, False, f"made its {budget.trials} trials")
    room = max(0, budget.concurrency - spent.live)
    return Verdict(min(room, budget.trials - spent.asked), False, None)


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"
