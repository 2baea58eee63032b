"""The store's side of the model registry: models, their versions and stages. Only SQL here;
the rules (who, which name, which stage moves) are the service's (broker/tasks/models.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import select

from broker.store import versioned
from broker.store.repository import Store
from broker.store.tables import ModelRow, ModelVersionRow


def version_of(row: ModelVersionRow) -> dict[str, Any]:
    return {
        "name": row.name,
        "version": row.version,
        "task_id": row.task_id,
        "kind": row.kind,
        "framework": row.framework,
        "files": json.loads(row.files),
        "metadata": json.loads(row.details),
        "tags": json.loads(row.tags),
        "metrics": json.loads(row.metrics),
        "stage": row.stage,
        "stage_by": row.stage_by,
        "stage_at": row.stage_at,
        "created_at": row.created_at,
    }


class ModelStore:
    """Models and versions, over the task store's engine and transactions."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def register(
        self,
        owner: Mapping[str, Any],
        version: Mapping[str, Any],
        allowed: Callable[[dict[str, Any]], bool],
    ) -> dict[str, Any] | None:
        """A new version of model owner['name'], numbered one past the last under the model's
        row lock: two registrations at once get two versions. `owner`: name, owner, team,
        project (kept from the first). None when `allowed` refuses the model as it stands."""

        def made(row: ModelRow, now: float) -> ModelVersionRow:
            return ModelVersionRow(
                name=row.name,
                version=row.latest,
                task_id=version["task_id"],
                kind=version["kind"],
                framework=version["framework"],
                files=json.dumps(version["files"]),
                details=json.dumps(version["metadata"]),
                tags=json.dumps(version["tags"]),
                metrics=json.dumps(version["metrics"]),
                stage="none",
                stage_by="",
                created_at=now,
            )

        return versioned.add_version(self.store, ModelRow, owner, allowed, made, version_of)

    def model(self, name: str) -> dict[str, Any] | None:
        return versioned.named(self.store, ModelRow, name)

    def models(self) -> list[dict[str, Any]]:
        return versioned.all_named(self.store, ModelRow)

    def versions(self, name: str) -> list[dict[str, Any]]:
        query = (
            select(ModelVersionRow)
            .where(ModelVersionRow.name == name)
            .order_by(ModelVersionRow.version)
        )
        with self.store.read() as session:
            return [version_of(row) for row in session.scalars(query)]

    def versions_of_task(self, task_id: int) -> list[dict[str, Any]]:
        query = (
            select(ModelVersionRow)
            .where(ModelVersionRow.task_id == task_id)
            .order_by(ModelVersionRow.id)
        )
        with self.store.read() as session:
            return [version_of(row) for row in session.scalars(query)]

    def set_stages(
        self,
        name: str,
        moves_of: Callable[[dict[int, str]], dict[int, str]],
        by: str,
    ) -> list[dict[str, Any]]:
        """Apply `moves_of(current stages)` ({version: stage}) in one transaction, under the
        model's row lock (two promotions at once leave one production version); the versions
        after it."""
        now = time.time()
        with self.store.write() as session:
            session.get(ModelRow, name, with_for_update=True)
            rows = list(
                session.scalars(select(ModelVersionRow).where(ModelVersionRow.name == name))
            )
            moves = moves_of({row.version: row.stage for row in rows})
            for row in rows:
                if row.version in moves and moves[row.version] != row.stage:
                    row.stage, row.stage_by, row.stage_at = moves[row.version], by, now
            session.flush()
            return [version_of(row) for row in sorted(rows, key=lambda r: r.version)]
