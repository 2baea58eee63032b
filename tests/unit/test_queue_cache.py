"""The scheduler's queued set between cycles: after the first full read, a cycle reads only the
tasks the store wrote since the last one, and sees every change."""

from __future__ import annotations

from broker.control.queue import QueueCache
from broker.domain import TaskSpec, TaskState
from broker.store.repository import Store


class CountingStore(Store):
    """A real store that remembers which ids each read of the queued tasks asked for."""

    reads: list[object]

    def queued(self, ids=None):  # type: ignore[no-untyped-def]
        self.reads.append(None if ids is None else sorted(ids))
        return super().queued(ids)


def test_a_cycle_reads_only_what_changed_and_sees_it(tmp_path) -> None:
    store = CountingStore.open(f"sqlite:///{tmp_path / 'k.db'}")
    store.reads = []
    spec = TaskSpec(command=("true",), resource="cpu")
    _, made = store.create_queued([(spec, 0.0, {})] * 3, "alice", None)
    cache = QueueCache(store)
    assert sorted(t.id for t in cache.current()) == [t.id for t in made]
    assert store.reads == [None]  # the first look reads everything
    assert len(cache.current()) == 3 and store.reads == [None]  # nothing changed: no read
    store.change_state(made[0].id, TaskState.CANCELLED, "gone", only_from=[TaskState.QUEUED])
    one = store.create_task(spec, "bob", "vision")
    store.update(made[1].id, skip_pools=["p"])
    queued = {t.id: t for t in cache.current()}
    assert store.reads[1:] == [sorted([made[0].id, made[1].id, one.id])]
    assert sorted(queued) == sorted([made[1].id, made[2].id, one.id])
    assert queued[one.id].team == "vision" and queued[made[1].id].skip_pools == {"p"}
    assert cache.attempts == dict.fromkeys(queued, 0)
    cache.full_every_s = 0  # a full read now and then, whatever the store says
    cache.current()
    assert store.reads[-1] is None
    store.close()
