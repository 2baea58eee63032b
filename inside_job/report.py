"""For the task's own code: `from inside_job import report; report.scalar("loss", 0.3, step=10)`
appends one line to $KLIQUE_JOB_DIR/scalars.jsonl (nothing happens outside a Klique job)."""

from __future__ import annotations

import json
import math
import os
import time

SCALARS_FILE = "scalars.jsonl"


def scalar(name: str, value: float, step: int | None = None) -> None:
    """Record value under name (at step); a NaN or infinite value is recorded as null."""
    if not isinstance(name, str) or not name:
        raise ValueError("scalar name must be a non-empty string")
    job_dir = os.environ.get("KLIQUE_JOB_DIR")
    if job_dir:
        append(job_dir, name, value, step)


def append(folder: str, name: str, value: float, step: int | None = None) -> None:
    """Append one scalar to folder/scalars.jsonl (the runner, or the SDK, reports it)."""
    number = float(value)
    item = {
        "name": name,
        "value": number if math.isfinite(number) else None,
        "step": None if step is None else int(step),
        "time": time.time(),
    }
    line = (json.dumps(item) + "\n").encode("utf-8")
    fd = os.open(os.path.join(folder, SCALARS_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
