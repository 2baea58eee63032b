"""The store's side of datasets: names, immutable versions, the blobs each keeper has sent,
and the versions each task read. Only SQL here; the rules (who, which name, which paths) are
the service's (broker/tasks/datasets.py) and broker/datasets/manifest.py's."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from broker.store import versioned
from broker.store.repository import Store
from broker.store.tables import DatasetBlobRow, DatasetReadRow, DatasetRow, DatasetVersionRow

# Digests asked about in one query (an IN list stays well under every database's bound).
_BATCH = 500


def version_of(row: DatasetVersionRow, with_manifest: bool = True) -> dict[str, Any]:
    out = {
        "name": row.name,
        "version": row.version,
        "parent": row.parent,
        "files": row.files,
        "size": row.size,
        "new_size": row.new_size,
        "created_by": row.created_by,
        "task_id": row.task_id,
        "created_at": row.created_at,
    }
    if with_manifest:
        out["manifest"] = json.loads(row.manifest)
    return out


class DatasetStore:
    """Datasets, versions, blobs and reads, over the task store's engine and transactions."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def add_version(
        self,
        owner: Mapping[str, Any],
        version: Mapping[str, Any],
        allowed: Callable[[dict[str, Any]], bool],
    ) -> dict[str, Any] | None:
        """A new version of dataset owner['name'], numbered one past the last under the
        dataset's row lock. `owner`: name, owner, team, project (kept from the first). None
        when `allowed` refuses the dataset as it stands."""

        def made(row: DatasetRow, now: float) -> DatasetVersionRow:
            return DatasetVersionRow(
                name=row.name,
                version=row.latest,
                parent=version["parent"],
                manifest=json.dumps(version["manifest"], sort_keys=True),
                files=len(version["manifest"]),
                size=version["size"],
                new_size=version["new_size"],
                created_by=version["created_by"],
                task_id=version["task_id"],
                created_at=now,
            )

        return versioned.add_version(self.store, DatasetRow, owner, allowed, made, version_of)

    def dataset(self, name: str) -> dict[str, Any] | None:
        return versioned.named(self.store, DatasetRow, name)

    def datasets(self) -> list[dict[str, Any]]:
        return versioned.all_named(self.store, DatasetRow)

    def versions(self, name: str) -> list[dict[str, Any]]:
        """A dataset's versions without their manifests, oldest first."""
        query = (
            select(DatasetVersionRow)
            .where(DatasetVersionRow.name == name)
            .order_by(DatasetVersionRow.version)
        )
        with self.store.read() as session:
            return [version_of(row, with_manifest=False) for row in session.scalars(query)]

    def version(self, name: str, number: int) -> dict[str, Any] | None:
        query = select(DatasetVersionRow).where(
            DatasetVersionRow.name == name, DatasetVersionRow.version == number
        )
        with self.store.read() as session:
            row = session.scalars(query).first()
            return version_of(row) if row is not None else None

    # Blobs, by keeper

    def held(self, keeper: str, digests: Collection[str]) -> dict[str, int]:
        """Which of `digests` the keeper has sent, with each one's size."""
        wanted = sorted(set(digests))
        found: dict[str, int] = {}
        with self.store.read() as session:
            for start in range(0, len(wanted), _BATCH):
                query = select(DatasetBlobRow.digest, DatasetBlobRow.size).where(
                    DatasetBlobRow.keeper == keeper,
                    DatasetBlobRow.digest.in_(wanted[start : start + _BATCH]),
                )
                found.update({digest: int(size) for digest, size in session.execute(query)})
        return found

    def hold(self, keeper: str, digest: str, size: int, task_id: int | None = None) -> None:
        """Record that the keeper sent `digest` (again is no error); `task_id`, the job whose
        report token sent it (its share counts it)."""
        try:
            with self.store.write() as session:
                if session.get(DatasetBlobRow, (digest, keeper)) is None:
                    session.add(
                        DatasetBlobRow(
                            digest=digest,
                            keeper=keeper,
                            size=size,
                            created_at=time.time(),
                            task_id=task_id,
                        )
                    )
        except IntegrityError:
            pass  # the same blob sent twice at once: one row is all it takes

    def sent_by_task(self, task_id: int) -> int:
        """Bytes of the blobs a job's report token sent that were new to its keeper."""
        query = select(func.coalesce(func.sum(DatasetBlobRow.size), 0)).where(
            DatasetBlobRow.task_id == task_id
        )
        with self.store.read() as session:
            return int(session.scalar(query) or 0)

    # Reads

    def record_read(self, task_id: int, name: str, version: int) -> None:
        try:
            with self.store.write() as session:
                query = select(DatasetReadRow.id).where(
                    DatasetReadRow.task_id == task_id,
                    DatasetReadRow.name == name,
                    DatasetReadRow.version == version,
                )
                if session.scalars(query).first() is None:
                    session.add(
                        DatasetReadRow(
                            task_id=task_id, name=name, version=version, time=time.time()
                        )
                    )
        except IntegrityError:
            pass  # two of the task's processes read it at once: recorded once

    def reads(self, task_id: int) -> list[dict[str, Any]]:
        """The dataset versions a task read, first read first."""
        query = (
            select(DatasetReadRow)
            .where(DatasetReadRow.task_id == task_id)
            .order_by(DatasetReadRow.id)
        )
        with self.store.read() as session:
            return [
                {"name": r.name, "version": r.version, "time": r.time}
                for r in session.scalars(query)
            ]

    def readers(self, name: str) -> dict[int, list[int]]:
        """The tasks that read each version of dataset `name`: version -> task ids, lowest
        first."""
        query = (
            select(DatasetReadRow.version, DatasetReadRow.task_id)
            .where(DatasetReadRow.name == name)
            .order_by(DatasetReadRow.version, DatasetReadRow.task_id)
        )
        found: dict[int, list[int]] = {}
        with self.store.read() as session:
            for version, task_id in session.execute(query):
                found.setdefault(int(version), []).append(int(task_id))
        return found

    def latest_sizes(self) -> dict[str, tuple[int, int]]:
        """Each dataset's newest version's files and bytes, by name."""
        query = select(
            DatasetVersionRow.name, DatasetVersionRow.files, DatasetVersionRow.size
        ).join(
            DatasetRow,
            (DatasetRow.name == DatasetVersionRow.name)
            & (DatasetRow.latest == DatasetVersionRow.version),
        )
        with self.store.read() as session:
            return {name: (int(files), int(size)) for name, files, size in session.execute(query)}
