"""What each `klique agent` last published (its pool's state and unknown jobs), kept in the
store when the server has replicas: an agent reports to whichever replica answers, and the
leader's placement reads every pool's latest report here."""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import select

from broker.store.repository import Store
from broker.store.tables import PoolReportRow


class PoolReport(NamedTuple):
    pool: str
    state: str  # JSON
    strangers: str  # JSON
    seen: float


def save_report(store: Store, report: PoolReport) -> None:
    with store.write() as session:
        row = session.get(PoolReportRow, report.pool, with_for_update=True)
        if row is None:
            session.add(PoolReportRow(**report._asdict()))
        elif row.seen <= report.seen:
            row.state, row.strangers, row.seen = report.state, report.strangers, report.seen


def reports(store: Store) -> list[PoolReport]:
    with store.read() as session:
        rows = session.scalars(select(PoolReportRow))
        return [PoolReport(r.pool, r.state, r.strangers, r.seen) for r in rows]
