"""The store's part for what a task reports beyond scalars (tables, images, plots, histograms,
texts, single values, media files): written with the runner's report, read by the API and the
task page. Module functions over the Store's own transactions, as broker/store/web.py does."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from broker.store.repository import Store
from broker.store.tables import ReportRow


@dataclass(frozen=True)
class StoredReport:
    """One report as stored, without its file's bytes (report_file reads those)."""

    id: int
    kind: str
    title: str
    series: str
    iteration: int | None
    time: float
    data: Any
    content_type: str
    size: int
    has_file: bool


def add_reports(store: Store, task_id: int, items: list[dict[str, Any]]) -> None:
    """Keep these reports (kind, title, series, iteration, time, data, content, content_type,
    size), in order."""
    with store.write() as session:
        for item in items:
            session.add(ReportRow(task_id=task_id, **{**item, "data": json.dumps(item["data"])}))


def report_tally(store: Store, task_id: int) -> tuple[dict[str, int], int]:
    """How many reports of each kind the task keeps, and their bytes in all (the bounds)."""
    query = (
        select(ReportRow.kind, func.count(), func.coalesce(func.sum(ReportRow.size), 0))
        .where(ReportRow.task_id == task_id)
        .group_by(ReportRow.kind)
    )
    with store.read() as session:
        rows = session.execute(query).all()
    return {kind: int(count) for kind, count, _ in rows}, sum(int(size) for *_, size in rows)


def reports(store: Store, task_id: int, kind: str | None = None) -> list[StoredReport]:
    """The task's reports (of one kind, if given), in the order they came."""
    columns = [c for c in ReportRow.__table__.columns if c.name not in ("content", "task_id")]
    query = (
        select(*columns, ReportRow.content.is_not(None).label("has_file"))
        .where(ReportRow.task_id == task_id)
        .order_by(ReportRow.id)
    )
    if kind is not None:
        query = query.where(ReportRow.kind == kind)
    with store.read() as session:
        rows = session.execute(query).mappings().all()
    return [StoredReport(**{**row, "data": json.loads(row["data"])}) for row in rows]


def report_file(store: Store, task_id: int, report_id: int) -> tuple[bytes, str, str] | None:
    """An image's or media file's bytes, its declared type and its kind; None if the task has
    no such report, or the report no file."""
    query = select(ReportRow.content, ReportRow.content_type, ReportRow.kind).where(
        ReportRow.id == report_id, ReportRow.task_id == task_id
    )
    with store.read() as session:
        row = session.execute(query).first()
    if row is None or row.content is None:
        return None
    return bytes(row.content), row.content_type, row.kind
