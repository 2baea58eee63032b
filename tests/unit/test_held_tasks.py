"""The tasks the pools hold, between looks: after the first full read, a look reads only the
tasks the store wrote since the last one, and sees every change; the queue's reads are its own."""

from __future__ import annotations

from broker.control import held as held_module
from broker.control.held import HeldTasks
from broker.control.queue import QueueCache
from broker.domain import TaskSpec, TaskState
from broker.execution import HOLDING
from broker.store.repository import Store

S = TaskState


class CountingStore(Store):
    """A real store that remembers which ids each read of tasks asked for."""

    reads: list[object]

    def tasks(self, **query):  # type: ignore[no-untyped-def]
        ids = query.get("ids")
        self.reads.append(None if ids is None else sorted(ids))
        return super().tasks(**query)


def test_a_look_reads_only_what_changed_and_sees_it(tmp_path) -> None:
    store = CountingStore.open(f"sqlite:///{tmp_path / 'k.db'}")
    store.reads = []
    spec = TaskSpec(command=("true",), resource="cpu")
    _, made = store.create_queued([(spec, 0.0, {})] * 4, "alice", None)
    a, b, c, d = (t.id for t in made)
    queue = QueueCache(store)  # another reader of the same changes
    assert len(queue.current()) == 4
    held = HeldTasks(store, HOLDING)
    assert held.current() == [] and store.reads == [None]  # the first look reads everything
    placed = {a: {"pool": "p"}, b: {"pool": "p"}, c: {"pool": "q"}}
    store.change_states(list(placed), S.PLACED, "", [S.QUEUED], placed)
    assert [t.id for t in held.current("p")] == [a, b]
    assert store.reads[1:] == [[a, b, c]]
    assert [(t.id, t.pool) for t in held.current()] == [(a, "p"), (b, "p"), (c, "q")]
    assert store.reads[2:] == []  # nothing changed since: no read

    store.update(a, native_id="7", job_dir="/jobs/7")
    store.change_state(a, S.SUBMITTED, only_from=[S.PLACED])
    store.change_state(b, S.CANCELLED, "by its owner", only_from=[S.PLACED])
    now = held.current("p")
    assert [(t.id, t.state, t.native_id) for t in now] == [(a, S.SUBMITTED, "7")]  # b left
    assert store.reads[2:] == [[a, b]]
    assert [t.id for t in queue.current()] == [d]  # the queue's reader saw the changes too

    held.full_every_s = 0  # a full read now and then, whatever the store says
    assert [t.id for t in held.current()] == [a, c]
    assert store.reads[-1] is None
    store.close()


def test_more_changes_than_a_pool_holds_are_one_full_read(tmp_path, monkeypatch) -> None:
    """A sweep of thousands made between two looks: the held tasks are read, not its ids."""
    monkeypatch.setattr(held_module, "MOST_CHANGED", 2)
    store = CountingStore.open(f"sqlite:///{tmp_path / 'k.db'}")
    store.reads = []
    held = HeldTasks(store, HOLDING)
    held.current()
    spec = TaskSpec(command=("true",), resource="cpu")
    store.create_queued([(spec, 0.0, {})] * 2, "alice", None)
    held.current()
    store.create_queued([(spec, 0.0, {})] * 3, "alice", None)
    held.current()
    assert store.reads == [None, [1, 2], None]
    store.close()
