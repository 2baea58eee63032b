"""The store's side of tuning: tunings, their trials, and what the tuner reads of the ledger
and the registry. Only SQL here; the rules are broker/tasks/tuning.py's and tuner.py's."""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from sqlalchemy import select

from broker.errors import NotFound
from broker.store.repository import Store
from broker.store.rows import scalar_of
from broker.store.tables import (
    LedgerRow,
    ModelVersionRow,
    ScalarRow,
    TuningRow,
    TuningTrialRow,
)

RUNNING = "running"


def tuning_of(row: TuningRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "owner": row.owner,
        "team": row.team,
        "name": row.name,
        "base_task_id": row.base_task_id,
        "resource": row.resource,
        "settings": json.loads(row.settings),
        "state": row.state,
        "reason": row.reason,
        "best": json.loads(row.best) if row.best else None,
        "created_at": row.created_at,
        "ended_at": row.ended_at,
    }


def trial_of(row: TuningTrialRow) -> dict[str, Any]:
    return {
        "number": row.number,
        "task_id": row.task_id,
        "params": json.loads(row.params),
        "state": row.state,
        "value": row.value,
        "pruned_step": row.pruned_step,
        "reason": row.reason,
        "created_at": row.created_at,
        "ended_at": row.ended_at,
    }


class TuningStore:
    """Tunings and trials, over the task store's engine and transactions."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def create(
        self,
        owner: str,
        team: str | None,
        name: str,
        base_task_id: int,
        resource: str,
        settings: Mapping[str, Any],
    ) -> dict[str, Any]:
        row = TuningRow(
            owner=owner,
            team=team,
            name=name,
            base_task_id=base_task_id,
            resource=resource,
            settings=json.dumps(settings),
            state=RUNNING,
            reason="asking for its first trials",
            best="",
            created_at=time.time(),
        )
        with self.store.write() as session:
            session.add(row)
            session.flush()
            return tuning_of(row)

    def get(self, tuning_id: int) -> dict[str, Any]:
        with self.store.read() as session:
            row = session.get(TuningRow, tuning_id)
            if row is None:
                raise NotFound(f"no tuning {tuning_id}")
            return tuning_of(row)

    def listing(
        self, owner: str | None, limit: int = 200, states: Collection[str] | None = None
    ) -> list[dict[str, Any]]:
        """Newest first; `owner` None: everyone's."""
        query = select(TuningRow).order_by(TuningRow.id.desc()).limit(limit)
        if owner is not None:
            query = query.where(TuningRow.owner == owner)
        if states is not None:
            query = query.where(TuningRow.state.in_(list(states)))
        with self.store.read() as session:
            return [tuning_of(row) for row in session.scalars(query)]

    def running(self, states: Collection[str] = (RUNNING,)) -> list[dict[str, Any]]:
        """The tunings the tuner follows, oldest first."""
        query = select(TuningRow).where(TuningRow.state.in_(list(states))).order_by(TuningRow.id)
        with self.store.read() as session:
            return [tuning_of(row) for row in session.scalars(query)]

    def update(self, tuning_id: int, **fields: Any) -> None:
        """Set a tuning's state, reason, best (JSON-able) or end."""
        if "best" in fields:
            fields["best"] = json.dumps(fields["best"]) if fields["best"] else ""
        with self.store.write() as session:
            row = session.get(TuningRow, tuning_id)
            if row is None:
                raise NotFound(f"no tuning {tuning_id}")
            for key, value in fields.items():
                setattr(row, key, value)

    def trials(self, tuning_id: int) -> list[dict[str, Any]]:
        query = (
            select(TuningTrialRow)
            .where(TuningTrialRow.tuning_id == tuning_id)
            .order_by(TuningTrialRow.number)
        )
        with self.store.read() as session:
            return [trial_of(row) for row in session.scalars(query)]

    def add_trials(self, tuning_id: int, trials: Sequence[Mapping[str, Any]]) -> None:
        now = time.time()
        with self.store.write() as session:
            for trial in trials:
                session.add(
                    TuningTrialRow(
                        tuning_id=tuning_id,
                        number=trial["number"],
                        task_id=trial.get("task_id"),
                        params=json.dumps(trial["params"]),
                        state=trial.get("state", RUNNING),
                        reason=trial.get("reason", ""),
                        created_at=now,
                        ended_at=None if trial.get("state", RUNNING) == RUNNING else now,
                    )
                )

    def update_trial(self, tuning_id: int, number: int, **fields: Any) -> None:
        query = select(TuningTrialRow).where(
            TuningTrialRow.tuning_id == tuning_id, TuningTrialRow.number == number
        )
        with self.store.write() as session:
            row = session.scalars(query).one()
            for key, value in fields.items():
                setattr(row, key, value)

    def objective_scalars(self, task_id: int, objective: str) -> list[dict[str, Any]]:
        """A task's scalars that may be the objective (`NAME`, or `TITLE/SERIES`), in order:
        the tuner reads these at every look, never a task's whole history of other scalars."""
        names = {objective, objective.split("/", 1)[0]}
        query = (
            select(ScalarRow)
            .where(ScalarRow.task_id == task_id, ScalarRow.name.in_(names))
            .order_by(ScalarRow.id)
        )
        with self.store.read() as session:
            return [scalar_of(row) for row in session.scalars(query)]

    def gpu_seconds(self, task_ids: Collection[int], now: float) -> float:
        """The ledger's GPU-seconds of these tasks, a run still open counted to `now`."""
        if not task_ids:
            return 0.0
        query = select(LedgerRow).where(LedgerRow.task_id.in_(list(task_ids)))
        with self.store.read() as session:
            return sum(
                r.gpu_seconds if r.end is not None else r.gpus * max(0.0, now - r.start)
                for r in session.scalars(query)
            )

    def model_of(self, task_id: int) -> dict[str, Any] | None:
        """The newest model version a task registered, if any: a best trial's model."""
        query = (
            select(ModelVersionRow)
            .where(ModelVersionRow.task_id == task_id)
            .order_by(ModelVersionRow.id.desc())
            .limit(1)
        )
        with self.store.read() as session:
            row = session.scalars(query).first()
            return None if row is None else {"name": row.name, "version": row.version}
