"""The store's side of the model registry: models, their versions and stages. Only SQL here;
the rules (who, which name, which stage moves) are the service's (broker/tasks/models.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from broker.store.repository import Store
from broker.store.tables import ModelRow, ModelVersionRow

# Two first registrations of one new name race to insert its row; the loser tries again and
# finds the row (then waits for its lock). More tries than that is not a race but a fault.
_TRIES = 3


def model_of(row: ModelRow) -> dict[str, Any]:
    return {
        "name": row.name,
        "owner": row.owner,
        "team": row.team,
        "project": row.project,
        "latest": row.latest,
        "created_at": row.created_at,
    }


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
        for attempt in range(_TRIES):
            try:
                return self._register(owner, version, allowed)
            except IntegrityError:
                if attempt == _TRIES - 1:
                    raise
        return None  # not reached

    def _register(
        self,
        owner: Mapping[str, Any],
        version: Mapping[str, Any],
        allowed: Callable[[dict[str, Any]], bool],
    ) -> dict[str, Any] | None:
        now = time.time()
        with self.store.write() as session:
            row = session.get(ModelRow, owner["name"], with_for_update=True)
            if row is None:
                row = ModelRow(**owner, latest=0, created_at=now)
                session.add(row)
                session.flush()
            if not allowed(model_of(row)):
                return None
            row.latest += 1
            made = ModelVersionRow(
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
            session.add(made)
            session.flush()
            return version_of(made)

    def model(self, name: str) -> dict[str, Any] | None:
        with self.store.read() as session:
            row = session.get(ModelRow, name)
            return model_of(row) if row is not None else None

    def models(self) -> list[dict[str, Any]]:
        with self.store.read() as session:
            return [model_of(r) for r in session.scalars(select(ModelRow).order_by(ModelRow.name))]

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
