"""The store's part for deleting runs: a run's scalars, reports, events and artifact rows go,
and its row is emptied and kept as a tombstone, since the usage ledger's rows point at it
(what the estate ran stays accounted for). A deleted run is no longer found by anything
(`Store.get`, the listings, the web store). Module functions over the Store's transactions,
as broker/store/reports.py does."""

from __future__ import annotations

import json
import time
from collections.abc import Collection

from sqlalchemy import delete, func, select

from broker.errors import KliqueError, NotFound
from broker.store.repository import Store
from broker.store.tables import (
    ArtifactRow,
    DatasetBlobRow,
    ModelVersionRow,
    ReportRow,
    ScalarRow,
    TaskEventRow,
    TaskRow,
)

_CONTENTS = (ScalarRow, ReportRow, TaskEventRow, ArtifactRow)


def delete_task(store: Store, task_id: int) -> list[str]:
    """Delete a run's record; the digests of its artifacts that nothing else refers to now (no
    other artifact, no dataset blob), for the caller to remove from the artifact store. A run
    that made a model version is refused: the version's files are its artifacts."""
    with store.write() as session:
        row = session.get(TaskRow, task_id, with_for_update=True)
        if row is None or row.deleted_at is not None:
            raise NotFound(f"no task {task_id}; `klique ls` lists your tasks")
        versions = select(func.count()).select_from(ModelVersionRow)
        made = session.scalar(versions.where(ModelVersionRow.task_id == task_id))
        if made:
            raise KliqueError(
                f"task {task_id} made {made} model version(s) in the registry, whose files are "
                "its artifacts; keep it archived instead"
            )
        own = select(ArtifactRow.digest).where(ArtifactRow.task_id == task_id)
        digests = set(session.scalars(own))
        for table in _CONTENTS:
            session.execute(delete(table).where(table.task_id == task_id))
        _empty(row)
        session.flush()
        others = select(ArtifactRow.digest).where(ArtifactRow.digest.in_(digests))
        blobs = select(DatasetBlobRow.digest).where(DatasetBlobRow.digest.in_(digests))
        kept = set(session.scalars(others)) | set(session.scalars(blobs))
    return sorted(digests - kept)


def _empty(row: TaskRow) -> None:
    """What is left of a deleted run: who, where and when (the ledger's), nothing it ran or
    reported (its command, environment, code, parameters, packages, tags)."""
    spec = json.loads(row.spec)
    spec.update(command=[], env={}, code=None)
    now = time.time()
    row.deleted_at = now
    row.updated_at = now
    row.spec = json.dumps(spec)
    row.name = ""
    row.reason = "deleted"
    row.diff = ""
    row.diff_bytes = 0
    row.parameters = "{}"
    row.packages = "[]"
    row.inputs = "[]"
    row.tags = "[]"
    row.claim = None
    row.report_digest = ""
    row.cache_key = None
    row.parent_id = None
    row.job_dir = None


def archived_before(
    store: Store, cutoff: float, projects: Collection[str] | None, other_than: Collection[str]
) -> list[int]:
    """Archived runs archived before `cutoff`: of these projects (None: of any project but
    `other_than`)."""
    query = select(TaskRow.id).where(
        TaskRow.deleted_at.is_(None),
        TaskRow.archived_at.is_not(None),
        TaskRow.archived_at < cutoff,
    )
    if projects is not None:
        query = query.where(TaskRow.project.in_(list(projects)))
    elif other_than:
        query = query.where(TaskRow.project.not_in(list(other_than)))
    with store.read() as session:
        return list(session.scalars(query.order_by(TaskRow.id)))
