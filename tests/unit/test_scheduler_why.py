"""`klique why` between placement cycles: a task that reached its pool's queue after the last
cycle, or whose pool has said more since, is explained by what the store holds now."""

from __future__ import annotations

from broker.control.loop import ControlLoop
from broker.domain import TaskSpec, TaskState
from broker.estate import builtin_estate
from broker.scheduler.model import PendingCode
from broker.store.repository import Store


def test_a_task_in_its_pools_queue_is_explained_without_waiting_for_a_cycle(tmp_path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'k.db'}")
    estate = builtin_estate(slots=1)
    control = ControlLoop(store, estate, {}, tmp_path)  # no cycle ever runs here
    pool = next(iter(estate.pools))
    task = store.create_task(TaskSpec(command=("true",), resource="cpu"), "alice", None)
    assert control.why(task) is None  # queued, and no cycle has looked at it yet

    store.update(task.id, state=TaskState.PENDING, pool=pool, reason="Insufficient gpu")
    reason = control.why(store.get(task.id))
    assert reason is not None and reason.primary is PendingCode.POOL_QUEUE
    assert reason.pools == {pool: "waiting in its queue (Insufficient gpu)"}

    store.update(task.id, intent="withdraw")
    reason = control.why(store.get(task.id))
    assert reason is not None and "withdrawn" in reason.pools[pool]

    store.update(task.id, state=TaskState.RUNNING, reason="")
    assert control.why(store.get(task.id)) is None
    store.close()
