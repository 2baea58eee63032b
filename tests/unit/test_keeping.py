"""What is kept of a run: tags (each once, sorted, bounded), a deleted run's record emptied and
hidden while the usage ledger keeps its rows, artifact contents removed only when nothing else
refers to them, and the estate's retention (global and per project) deleting archived runs."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from broker.artifacts import ArtifactStore
from broker.domain import Retention, TaskSpec, TaskState
from broker.errors import KliqueError, NotFound
from broker.estate import parse_estate
from broker.store import keeping as stored
from broker.store import reports as stored_reports
from broker.store.repository import Store
from broker.tasks import keeping
from broker.tasks.keeping import DAY_S, retagged

ESTATE = "resources:\n  cpu: {profile: {pools: [p]}}\npools:\n  p: {kind: host}\n"


def test_tags_are_kept_once_sorted_and_bounded() -> None:
    assert retagged(["b"], ["a", "b", "c"], ["c"]) == ["a", "b"]
    with pytest.raises(KliqueError, match="at most 50 tags"):
        retagged([], [f"t{i}" for i in range(51)], [])


def test_the_estate_names_a_retention_globally_and_per_project() -> None:
    estate = parse_estate(ESTATE + "retention: {days: 30, projects: {scratch: 1}}\n")
    assert estate.retention == Retention(30.0, {"scratch": 1.0})
    assert estate.retention.days_for("scratch") == 1.0
    assert estate.retention.days_for("papers") == 30.0
    assert parse_estate(ESTATE).retention.days_for("any") is None
    with pytest.raises(Exception, match="retention.days"):
        parse_estate(ESTATE + "retention: {days: 0}\n")


async def _chunks(*parts: bytes):  # type: ignore[no-untyped-def]
    for part in parts:
        yield part


def ended_run(store: Store, artifacts: ArtifactStore, project: str, content: bytes) -> int:
    """A completed run of `project` with a scalar, a report and an artifact of `content`."""
    spec = TaskSpec(("true",), "cpu", project=project)
    task = store.create_task(spec, "alice", "vision", state=TaskState.RUNNING)
    store.change_state(task.id, TaskState.COMPLETED)
    store.add_scalars(task.id, [{"name": "loss", "value": 0.5, "step": 1, "time": 1.0}])
    item = {"kind": "text", "title": "t", "series": "", "iteration": None, "time": 1.0}
    item.update(data={"text": "x"}, content=None, content_type="", size=1)
    stored_reports.add_reports(store, task.id, [item])
    digest, size = asyncio.run(artifacts.put(_chunks(content)))
    store.add_artifact(
        task.id,
        name="w",
        kind="file",
        filename="w",
        digest=digest,
        size=size,
        created_at=time.time(),
    )
    return task.id


@pytest.fixture
def control(store: Store, tmp_path: Path) -> SimpleNamespace:
    estate = parse_estate(ESTATE + "retention: {days: 30, projects: {scratch: 1}}\n")
    return SimpleNamespace(store=store, estate=estate, home=tmp_path)


def test_a_deleted_run_is_emptied_and_hidden_and_its_unshared_artifacts_go(control) -> None:
    store = control.store
    artifacts = ArtifactStore(None, control.home, max_bytes=1 << 20)
    shared = ended_run(store, artifacts, "papers", b"same weights")
    alone = ended_run(store, artifacts, "papers", b"same weights")
    other = ended_run(store, artifacts, "papers", b"other weights")
    digest_shared = store.artifact(shared, "w")["digest"]
    digest_other = store.artifact(other, "w")["digest"]
    ledger = [(row.task_id, row.owner, row.project) for row in store.ledger()]
    assert alone in [task for task, _, _ in ledger]

    keeping.forget(control, store.get(alone), artifacts)
    keeping.forget(control, store.get(other), artifacts)
    with pytest.raises(NotFound):
        store.get(alone)
    assert [t.id for t in store.tasks()] == [shared]
    assert artifacts.exists(digest_shared)  # task `shared` still has it
    assert not artifacts.exists(digest_other)
    assert store.artifacts(alone) == [] and store.scalar_count(alone) == 0
    assert stored_reports.report_tally(store, alone) == ({}, 0)
    assert [(row.task_id, row.owner, row.project) for row in store.ledger()] == ledger
    with pytest.raises(NotFound):
        stored.delete_task(store, alone)  # once


def test_retention_deletes_archived_runs_past_their_projects_days_only(control) -> None:
    store = control.store
    artifacts = ArtifactStore(None, control.home, max_bytes=1 << 20)
    now = time.time()
    runs = {
        "scratch, 2 days": ("scratch", now - 2 * DAY_S),
        "scratch, 1 hour": ("scratch", now - 3600),
        "papers, 40 days": ("papers", now - 40 * DAY_S),
        "papers, 20 days": ("papers", now - 20 * DAY_S),
        "papers, not archived": ("papers", None),
    }
    ids = {}
    for name, (project, archived_at) in runs.items():
        ids[name] = ended_run(store, artifacts, project, name.encode())
        store.update(ids[name], archived_at=archived_at)
    chore = keeping.Retention(control, artifacts)
    assert chore(now) == sorted([ids["scratch, 2 days"], ids["papers, 40 days"]])
    assert chore(now + 1) == []  # it paces itself
    left = {t.id for t in store.tasks()}
    assert left == {ids[n] for n in ("scratch, 1 hour", "papers, 20 days", "papers, not archived")}
