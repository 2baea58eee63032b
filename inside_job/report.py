"""For the task's own code: `from inside_job import report; report.scalar("loss", 0.3, step=10)`
appends one line to $KLIQUE_JOB_DIR/scalars.jsonl (nothing happens outside a Klique job).
klique's Logger writes here too: scalars with a series, and reports beyond scalars, one line
each in reports.jsonl (the runner's reporter sends both)."""

from __future__ import annotations

import json
import math
import os
import time

SCALARS_FILE = "scalars.jsonl"
REPORTS_FILE = "reports.jsonl"


def scalar(name: str, value: float, step: int | None = None) -> None:
    """Record value under name (at step); a NaN or infinite value is recorded as null."""
    if not isinstance(name, str) or not name:
        raise ValueError("scalar name must be a non-empty string")
    job_dir = os.environ.get("KLIQUE_JOB_DIR")
    if job_dir:
        append(job_dir, name, value, step)


def append(folder: str, name: str, value: float, step: int | None = None, series: str = "") -> None:
    """Append one scalar to folder/scalars.jsonl (the runner, or the SDK, reports it): a point
    of chart `name`, on its line `series` ("" : the chart's one line)."""
    number = float(value)
    item = {
        "name": name,
        "value": number if math.isfinite(number) else None,
        "step": None if step is None else int(step),
        "time": time.time(),
    }
    if series:
        item["series"] = series
    _append_line(os.path.join(folder, SCALARS_FILE), json.dumps(item))


def append_report(folder: str, item: dict) -> None:
    """Append one report beyond scalars (klique/logger.py shapes it) to folder/reports.jsonl."""
    _append_line(os.path.join(folder, REPORTS_FILE), json.dumps(item, allow_nan=False))


def _append_line(path: str, text: str) -> None:
    # One write of the whole line (O_APPEND): a reader sees it whole, or not yet.
    line = (text + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        written = 0
        while written < len(line):
            written += os.write(fd, line[written:])
    finally:
        os.close(fd)
