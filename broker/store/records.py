"""The store's part for the SDK's record: report tokens as identities, pipeline steps, cached
steps, parameters and artifacts (their rows; the content is in the artifact store)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from broker.domain import Task, TaskState
from broker.errors import NotFound
from broker.store.rows import ARTIFACT_FIELDS, artifact_of, task_of
from broker.store.tables import ArtifactRow, ScalarRow, TaskRow


class RecordMethods:
    """Mixed into Store, which provides `read` and `write`."""

    write: Callable[[], AbstractContextManager[Session]]
    read: Callable[[], Session]

    def task_for_report_digest(self, digest: str) -> Task | None:
        """The task whose current report token has this digest (tokens are random: at most one)."""
        if not digest:
            return None
        with self.read() as session:
            row = session.scalar(select(TaskRow).where(TaskRow.report_digest == digest))
            return task_of(row, with_diff=False) if row is not None else None

    def scalar_count(self, task_id: int) -> int:
        """How many scalar points the task has (limits.max_scalars bounds them)."""
        query = select(func.count()).select_from(ScalarRow).where(ScalarRow.task_id == task_id)
        with self.read() as session:
            return int(session.scalar(query) or 0)

    def children(self, parent: int) -> list[Task]:
        """The tasks `parent` made (a pipeline's steps), in the order they were made."""
        query = select(TaskRow).where(TaskRow.parent_id == parent).order_by(TaskRow.id)
        with self.read() as session:
            return [task_of(row, with_diff=False) for row in session.scalars(query)]

    def cached(self, owner: str, key: str) -> Task | None:
        """The newest completed task of `owner` with this cache key (same code and inputs)."""
        query = (
            select(TaskRow)
            .where(
                TaskRow.owner == owner,
                TaskRow.cache_key == key,
                TaskRow.state == TaskState.COMPLETED.value,
            )
            .order_by(TaskRow.id.desc())
            .limit(1)
        )
        with self.read() as session:
            row = session.scalar(query)
            return task_of(row, with_diff=False) if row is not None else None

    def merge_parameters(
        self, task_id: int, values: dict[str, Any], overwrite: bool
    ) -> dict[str, Any]:
        """Add `values` to the task's parameters (replacing stored ones only if `overwrite`)."""
        with self.write() as session:
            row = _row(session, task_id)
            stored = json.loads(row.parameters or "{}")
            merged = {**stored, **values} if overwrite else {**values, **stored}
            row.parameters = json.dumps(merged)
            row.updated_at = time.time()
            return dict(merged)

    # Artifacts

    def add_artifact(self, task_id: int, **fields: Any) -> dict[str, Any]:
        """Record (or replace) the task's artifact `fields['name']`."""
        with self.write() as session:
            _row(session, task_id)
            query = select(ArtifactRow).where(
                ArtifactRow.task_id == task_id, ArtifactRow.name == fields["name"]
            )
            row = session.scalar(query) or ArtifactRow(task_id=task_id, name=fields["name"])
            for key, value in fields.items():
                setattr(row, key, value)
            row.created_at = time.time()
            session.add(row)
            session.flush()
            return artifact_of(row)

    def artifacts(self, task_id: int) -> list[dict[str, Any]]:
        query = select(ArtifactRow).where(ArtifactRow.task_id == task_id).order_by(ArtifactRow.id)
        with self.read() as session:
            return [artifact_of(row) for row in session.scalars(query)]

    def artifact(self, task_id: int, name: str) -> dict[str, Any] | None:
        query = select(ArtifactRow).where(ArtifactRow.task_id == task_id, ArtifactRow.name == name)
        with self.read() as session:
            row = session.scalar(query)
            return artifact_of(row) if row is not None else None

    def copy_artifacts(self, source: int, dest: int) -> None:
        """Give `dest` the artifacts of `source`: rows only, the content is shared by digest."""
        for found in self.artifacts(source):
            self.add_artifact(dest, **{k: found[k] for k in ARTIFACT_FIELDS if k != "created_at"})


def _row(session: Session, task_id: int) -> TaskRow:
    row = session.get(TaskRow, task_id, with_for_update=True)
    if row is None:
        raise NotFound(f"no task {task_id}")
    return row
