"""What a task reports beyond scalars: kept with the runner's report, within the task's bounds
(broker/bounds.py), and read back by whoever may read the task. An image's or media file's
bytes are served so that no browser runs them: PNG and JPEG (by their first bytes, whatever
the task declared) shown as images, everything else a download of opaque bytes."""

from __future__ import annotations

import base64
import binascii
import json
import time
from dataclasses import dataclass
from typing import Any

from broker.bounds import item_problem, reports_problem
from broker.domain import Task
from broker.errors import KliqueError, NotFound, TooLarge
from broker.store import reports as stored
from broker.tasks.control import TaskControl
from broker.tasks.report_schemas import ReportIn, ReportOut

# The first bytes of the two image formats a page shows inline (PNG: RFC 2083 section 3.1;
# JPEG: the SOI marker and the next marker's first byte, ITU T.81 annex B).
MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"))
OPAQUE = "application/octet-stream"


@dataclass(frozen=True)
class Served:
    """How a report's file goes to a browser: its Content-Type, and whether it is a download."""

    media_type: str
    attachment: bool


def served(content: bytes) -> Served:
    """PNG and JPEG, known by their bytes, inline; anything else (HTML in an image's clothes,
    SVG, a script) a download of opaque bytes."""
    for magic, media_type in MAGIC:
        if content.startswith(magic):
            return Served(media_type, attachment=False)
    return Served(OPAQUE, attachment=True)


def keep(loop: TaskControl, task: Task, items: list[ReportIn]) -> None:
    """Keep the runner's reports, in order, up to the first that passes one of the task's
    bounds; TooLarge, naming the bound, when one does (it and those after it are dropped)."""
    if not items:
        return
    rows = [_row(task.id, item) for item in items]
    kept, kept_bytes = stored.report_tally(loop.store, task.id)
    limits = loop.estate.limits
    problem = None
    for end, row in enumerate(rows):
        kind, size = row["kind"], row["size"]
        problem = item_problem(task.id, kind, row["title"], size)
        problem = problem or reports_problem(limits, task.id, kept, kept_bytes, [(kind, size)])
        if problem:
            rows = rows[:end]
            break
        kept[kind] = kept.get(kind, 0) + 1
        kept_bytes += size
    stored.add_reports(loop.store, task.id, rows)
    if problem:
        raise TooLarge(problem)


def listing(loop: TaskControl, task: Task, kind: str | None) -> list[ReportOut]:
    """The task's reports (of one kind), each with the API path of its file, if it has one."""
    return [
        ReportOut(
            id=r.id,
            kind=r.kind,
            title=r.title,
            series=r.series,
            iteration=r.iteration,
            time=r.time,
            data=r.data,
            content_type=r.content_type,
            size=r.size,
            file=f"/api/v1/tasks/{task.id}/reports/{r.id}/file" if r.has_file else None,
        )
        for r in stored.reports(loop.store, task.id, kind)
    ]


def file_of(loop: TaskControl, task: Task, report_id: int) -> tuple[bytes, Served]:
    """A report's file and how to serve it; NotFound if the task has no such file."""
    found = stored.report_file(loop.store, task.id, report_id)
    if found is None:
        raise NotFound(f"task {task.id} has no report {report_id} with a file")
    content, _, _ = found
    return content, served(content)


def _row(task_id: int, item: ReportIn) -> dict[str, Any]:
    content = _decoded(task_id, item) if item.content is not None else None
    data_size = len(json.dumps(item.data).encode())
    return {
        "kind": item.kind,
        "title": item.title,
        "series": item.series,
        "iteration": item.iteration,
        "time": item.time or time.time(),
        "data": item.data,
        "content": content,
        "content_type": item.content_type or "",
        "size": data_size + len(content or b""),
    }


def _decoded(task_id: int, item: ReportIn) -> bytes:
    try:
        return base64.b64decode(item.content or "", validate=True)
    except (binascii.Error, ValueError):
        raise KliqueError(
            f"task {task_id}'s {item.kind} report {item.title!r}: its content is not base64; "
            "fix: report it through klique's Logger"
        ) from None
