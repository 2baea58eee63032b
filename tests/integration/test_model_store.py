"""The registry's store on SQLite and on a real PostgreSQL server: registrations at the same
moment get versions of their own, and promotions at the same moment leave one production."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy

from broker.domain import TaskSpec
from broker.models.rules import stage_moves
from broker.store.engine import normalise_url
from broker.store.models import ModelStore
from broker.store.repository import Store

AT_ONCE = 8


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def models(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'k.db'}"
    else:  # a schema of its own: runs never see each other's rows
        base = request.getfixturevalue("postgres_url")
        schema = f"m_{uuid.uuid4().hex[:12]}"
        engine = sqlalchemy.create_engine(normalise_url(base))
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
        engine.dispose()
        url = f"{base}?options=-csearch_path%3D{schema}"
    store = Store.open(url)
    yield (
        ModelStore(store),
        store.create_task(TaskSpec(command=("true",), resource="cpu"), "alice", "vision"),
    )
    store.close()


def at_once(work: Callable[[int], Any]) -> list[Any]:
    """`work(i)` for AT_ONCE threads released together; their results."""
    barrier = threading.Barrier(AT_ONCE)
    results: list[Any] = [None] * AT_ONCE

    def one(i: int) -> None:
        barrier.wait()
        results[i] = work(i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(AT_ONCE)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def version_of(task_id: int) -> dict[str, Any]:
    files = [{"path": "w", "digest": "0" * 64, "size": 1}]
    return {
        "task_id": task_id,
        "kind": "file",
        "framework": "",
        "files": files,
        "metadata": {},
        "tags": [],
        "metrics": {},
    }


def test_registrations_at_once_get_a_version_each(models) -> None:
    registry, task = models
    owner = {"name": "demo", "owner": "alice", "team": "vision", "project": "default"}
    made = at_once(lambda i: registry.register(owner, version_of(task.id), lambda m: True))
    assert sorted(m["version"] for m in made) == list(range(1, AT_ONCE + 1))
    assert registry.model("demo")["latest"] == AT_ONCE


def test_promotions_at_once_leave_one_production_version(models) -> None:
    registry, task = models
    owner = {"name": "demo", "owner": "alice", "team": "vision", "project": "default"}
    for _ in range(AT_ONCE):
        registry.register(owner, version_of(task.id), lambda m: True)
    at_once(
        lambda i: registry.set_stages(
            "demo", lambda now: stage_moves(now, i + 1, "production"), "alice"
        )
    )
    stages = [v["stage"] for v in registry.versions("demo")]
    assert stages.count("production") == 1
    assert stages.count("archived") == AT_ONCE - 1
