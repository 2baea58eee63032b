"""Metering: the ledger's runs summed by team, project or user over a window, ongoing runs to now.

Pure: the API reads the ledger from the store and hands its rows here.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

UsageKey = Literal["team", "project", "user", "pool", "resource"]
USAGE_KEYS: tuple[str, ...] = get_args(UsageKey)
NO_TEAM = "(no team)"

_AGO = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])", re.IGNORECASE)
_AGO_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass(frozen=True)
class Run:
    """One ledger row: a task held `gpus` GPUs on a pool from `start` to `end` (None: still)."""

    owner: str
    team: str | None
    project: str
    resource: str
    pool: str
    gpus: float
    start: float
    end: float | None


@dataclass(frozen=True)
class UsageLine:
    """What one key (a team, a project, a user) used within the window."""

    key: str
    runs: int
    gpu_seconds: float
    wall_seconds: float
    ongoing: int  # runs still going: counted up to `until`

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600


def summarise(
    runs: Iterable[Run], by: UsageKey, until: float, since: float | None = None
) -> list[UsageLine]:
    """Sum each key's runs that overlap [since, until], clipped to it; most GPU-seconds first.

    A run that began before `since` counts only from `since`; one still going counts up to
    `until`. A run that lies wholly outside the window is left out.
    """
    totals: dict[str, list[float]] = {}
    for run in runs:
        start = run.start if since is None else max(run.start, since)
        end = until if run.end is None else min(run.end, until)
        if end < start:
            continue
        line = totals.setdefault(_key(run, by), [0, 0.0, 0.0, 0])
        line[0] += 1
        line[1] += run.gpus * (end - start)
        line[2] += end - start
        line[3] += run.end is None
    lines = [
        UsageLine(key, int(n), gpu_s, wall_s, int(ongoing))
        for key, (n, gpu_s, wall_s, ongoing) in totals.items()
    ]
    return sorted(lines, key=lambda u: (-u.gpu_seconds, -u.wall_seconds, u.key))


def _key(run: Run, by: UsageKey) -> str:
    if by == "team":
        return run.team or NO_TEAM
    if by == "user":
        return run.owner
    value: str = getattr(run, by)
    return value


def parse_since(text: str, now: float) -> float:
    """'7d', '12h', '90m', '2w' ago; a date '2026-11-01' (local midnight); an ISO time; or Unix s.

    Raises ValueError with the accepted forms.
    """
    value = text.strip()
    match = _AGO.fullmatch(value)
    if match:
        return now - float(match[1]) * _AGO_UNITS[match[2].lower()]
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a time ago nor a date; fix: write it like 7d, 12h or 30m, "
            "a date like 2026-11-01, a time like 2026-11-01T09:00, or Unix seconds"
        ) from None
    return when.timestamp()  # a naive date or time is read in the local time zone
