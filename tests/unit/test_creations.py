"""Single creates of concurrent requests are written together: each request gets its own
task, owners are kept apart, a failed transaction fails its requests only, and the writer
thread comes and goes with the work."""

from __future__ import annotations

import asyncio
import time

import pytest

from broker.domain import TaskSpec, TaskState
from broker.tasks import creations as module
from broker.tasks.creations import Creations


def spec(name: str) -> TaskSpec:
    return TaskSpec(("true",), "cpu", name=name)


def counting_creates(monkeypatch) -> list[object]:
    """Each create handed to the writer, as it is handed."""
    handed: list[object] = []

    def counted(*args):
        handed.append(made := real(*args))
        return made

    real = module._Create
    monkeypatch.setattr(module, "_Create", counted)
    return handed


async def handed(creates: list[object], count: int) -> None:
    deadline = time.monotonic() + 30
    while len(creates) < count:
        assert time.monotonic() < deadline, "the creates never reached the writer"
        await asyncio.sleep(0.01)


def test_concurrent_creates_share_a_transaction_and_each_gets_its_own_task(store, monkeypatch):
    transactions: list[int] = []
    write = store.create_queued_each

    def counted(items):
        transactions.append(len(items))
        return write(items)

    monkeypatch.setattr(store, "create_queued_each", counted)
    creates = counting_creates(monkeypatch)
    creations = Creations(store)

    async def main():
        first = asyncio.ensure_future(creations.create(spec("first"), 0.0, "carol", None))
        await first  # alone: written at once, in a transaction of its own
        with store._writer:  # another writer holds the store: the creates wait for it
            made = [
                asyncio.ensure_future(creations.create(spec(f"t{i}"), 0.5, owner, team))
                for i, (owner, team) in enumerate([("alice", "vision"), ("bob", None)] * 25)
            ]
            await handed(creates, 51)  # all handed to the writer, which waits for the store
        return [await first, *await asyncio.gather(*made)]

    tasks = asyncio.run(main())
    assert transactions[0] == 1 and sum(transactions) == 51 and len(transactions) <= 3
    assert len({t.id for t in tasks}) == 51
    for i, task in enumerate(tasks[1:]):
        stored = store.get(task.id)
        assert (stored.spec.name, stored.state) == (f"t{i}", TaskState.QUEUED)
        assert (stored.owner, stored.team) == (("alice", "vision"), ("bob", None))[i % 2]
        assert (task.owner, task.team, task.gpus) == (stored.owner, stored.team, 0.5)
    assert store.get(tasks[0].id).owner == "carol"


def test_a_failed_transaction_fails_its_requests_and_the_next_creates_go_on(store, monkeypatch):
    creations = Creations(store)
    write = store.create_queued_each
    failures = iter([True])

    def failing_once(items):
        if next(failures, False):
            raise RuntimeError("database is locked")
        return write(items)

    monkeypatch.setattr(store, "create_queued_each", failing_once)

    async def main():
        with pytest.raises(RuntimeError, match="database is locked"):
            await creations.create(spec("lost"), 0.0, "alice", None)
        return await creations.create(spec("kept"), 0.0, "alice", None)

    kept = asyncio.run(main())
    assert store.get(kept.id).spec.name == "kept"
    assert [t.spec.name for t in store.tasks()] == ["kept"]


def test_the_writer_thread_ends_when_idle_and_the_next_create_starts_it(store, monkeypatch):
    monkeypatch.setattr(module, "IDLE_S", 0.05)
    creations = Creations(store)

    async def create(name: str) -> int:
        return (await creations.create(spec(name), 0.0, "alice", None)).id

    first = asyncio.run(create("a"))
    writer = creations._writer
    assert writer is not None
    writer.join(30)
    assert not writer.is_alive() and creations._writer is None
    second = asyncio.run(create("b"))
    assert second > first and store.get(second).spec.name == "b"
