"""Placement on plain data: pool order, packing, queueing pools, spill-over, pending reasons."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from helpers.estates import estate_of

from broker.domain import ComputeResource, Estate, Policy, Pool, Profile
from broker.execution import PoolState
from broker.scheduler.placement import (
    ActiveTask,
    PendingCode,
    QueuedTask,
    SchedulerInput,
    SchedulerOutput,
    place,
)


def host(name: str, gpus: int = 4, slots: int = 8, memory: int = 80_000) -> Pool:
    return Pool(name, "host", slots=slots, gpus=gpus, gpu_memory_mb=memory)


def slurm(name: str, max_queued: int = 10, max_wait_s: int | None = None) -> Pool:
    return Pool(
        name, "slurm", queueing=True, spans_nodes=True, max_queued=max_queued, max_wait_s=max_wait_s
    )


def resource(name: str, *pools: str, **profile: Any) -> ComputeResource:
    return ComputeResource(name, Profile(pools=pools, **profile))


def queued(task_id: int, resource: str = "1-gpu", team: str | None = "a", **kw: Any) -> QueuedTask:
    at = float(kw.pop("at", task_id))
    return QueuedTask(task_id, f"user{task_id}", team, resource, at, **kw)


def running(
    task_id: int, pool: str, resource: str = "1-gpu", team: str | None = "a", **kw: Any
) -> ActiveTask:
    return ActiveTask(task_id, "someone", team, resource, pool, True, 0.0, **kw)


def cycle(
    the_estate: Estate,
    tasks: list[QueuedTask],
    active: Sequence[ActiveTask] = (),
    now: float = 1000.0,
    **states: PoolState,
) -> SchedulerOutput:
    reports = {name: states.get(name, PoolState(name)) for name in the_estate.pools}
    return place(SchedulerInput(the_estate, tasks, active, reports, now=now))


def where(out: SchedulerOutput) -> dict[int, str]:
    return {d.task_id: d.pool for d in out.placements}


# -- pool order and capacity ------------------------------------------------------------------


def test_a_task_goes_to_the_first_pool_in_its_order_that_can_start_it() -> None:
    e = estate_of([host("box", gpus=1), slurm("hpc")], [resource("1-gpu", "box", "hpc", gpus=1)])
    out = cycle(e, [queued(1), queued(2)])
    assert where(out) == {1: "box", 2: "hpc"}


def test_whole_gpus_need_whole_free_gpus() -> None:
    e = estate_of([host("box", gpus=4)], [resource("2-gpu", "box", gpus=2)])
    out = cycle(e, [queued(i, "2-gpu") for i in (1, 2, 3)])
    assert {d.task_id: d.gpus for d in out.placements} == {1: (0, 1), 2: (2, 3)}
    assert out.pending[3].primary is PendingCode.NO_CAPACITY
    assert out.pending[3].pools == {"box": "needs 2 GPUs, 0 free"}


def test_fractions_pack_onto_the_fullest_gpu_that_fits() -> None:
    e = estate_of(
        [host("box", gpus=2)],
        [
            resource("half", "box", gpu_fraction=0.5),
            resource("quarter", "box", gpu_fraction=0.25),
            resource("1-gpu", "box", gpus=1),
        ],
    )
    tasks = [
        queued(1, "half"),
        queued(2, "quarter"),
        queued(3, "quarter"),
        queued(4, "1-gpu"),
        queued(5, "quarter"),
    ]
    out = cycle(e, tasks)
    assert {d.task_id: d.gpus for d in out.placements} == {1: (0,), 2: (0,), 3: (0,), 4: (1,)}
    assert out.pending[5].pools == {"box": "needs 0.25 of a GPU, no GPU has that much left"}


def test_gpu_memory_counts_as_a_share_of_one_gpu() -> None:
    e = estate_of(
        [host("box", gpus=2, memory=40_000)],
        [
            resource("30g", "box", gpu_memory_mb=30_000),
            resource("10g", "box", gpu_memory_mb=10_000),
            resource("20g", "box", gpu_memory_mb=20_000),
            resource("50g", "box", gpu_memory_mb=50_000),
        ],
    )
    tasks = [
        queued(1, "30g"),
        queued(2, "30g"),
        queued(3, "10g"),
        queued(4, "20g"),
        queued(5, "50g"),
    ]
    out = cycle(e, tasks)
    assert {d.task_id: d.gpus for d in out.placements} == {1: (0,), 2: (1,), 3: (0,)}
    assert out.pending[4].pools == {
        "box": "needs 20000 MB of GPU memory, no GPU has that much left"
    }
    assert out.pending[5].pools == {"box": "needs 50000 MB of GPU memory, its GPUs have 40000 MB"}


def test_running_tasks_keep_the_gpus_they_were_given() -> None:
    e = estate_of(
        [host("box", gpus=2)],
        [resource("half", "box", gpu_fraction=0.5), resource("1-gpu", "box", gpus=1)],
    )
    out = cycle(e, [queued(1, "1-gpu"), queued(2, "half")], [running(9, "box", "half", gpus=(0,))])
    assert {d.task_id: d.gpus for d in out.placements} == {1: (1,), 2: (0,)}


def test_pools_that_split_a_hosts_gpus_give_out_only_their_own() -> None:
    low = Pool("low", "host", slots=4, gpus=2, gpu_ids=(0, 1))
    high = Pool("high", "host", slots=4, gpus=2, gpu_ids=(2, 3))
    e = estate_of(
        [low, high],
        [resource("1-gpu", "low", "high", gpus=1), resource("half", "high", gpu_fraction=0.5)],
    )
    tasks = [queued(1), queued(2), queued(3, "half"), queued(4), queued(5)]
    out = cycle(e, tasks, [running(9, "high", "half", gpus=(3,))])
    placed = {d.task_id: (d.pool, d.gpus) for d in out.placements}
    # 3 joins the running half on GPU 3; the whole GPUs go 0, 1 (low), then 2 (high).
    assert placed == {1: ("low", (0,)), 2: ("low", (1,)), 3: ("high", (3,)), 4: ("high", (2,))}
    assert out.pending[5].pools == {"low": "needs 1 GPU, 0 free", "high": "needs 1 GPU, 0 free"}


def test_host_slots_are_counted() -> None:
    e = estate_of([host("box", gpus=0, slots=2)], [resource("cpu", "box")])
    out = cycle(e, [queued(i, "cpu") for i in (1, 2, 3)])
    assert where(out) == {1: "box", 2: "box"}
    assert out.pending[3].pools == {"box": "all 2 slots in use"}


def test_a_queueing_pool_starts_what_fits_then_queues_up_to_max_queued() -> None:
    e = estate_of([slurm("hpc", max_queued=3)], [resource("1-gpu", "hpc", gpus=1)])
    out = cycle(e, [queued(i) for i in range(1, 6)], hpc=PoolState("hpc", free_gpus=2, queued=1))
    assert where(out) == {1: "hpc", 2: "hpc", 3: "hpc", 4: "hpc"}
    assert out.pending[5].pools == {"hpc": "needs 1 GPU, 0 free; at max_queued (3)"}


def test_a_queueing_pool_that_reports_no_room_only_queues() -> None:
    e = estate_of([slurm("hpc", max_queued=2)], [resource("cpu", "hpc")])
    out = cycle(e, [queued(i, "cpu") for i in (1, 2, 3)])
    assert where(out) == {1: "hpc", 2: "hpc"}
    assert out.pending[3].pools == {"hpc": "reports no free room; at max_queued (2)"}


def test_klique_tasks_waiting_in_the_pool_count_against_max_queued() -> None:
    e = estate_of([slurm("hpc", max_queued=2)], [resource("1-gpu", "hpc", gpus=1)])
    waiting = [ActiveTask(i, "u", "a", "1-gpu", "hpc", False, 900.0) for i in (7, 8)]
    out = cycle(e, [queued(1)], waiting)
    assert out.placements == []
    assert out.pending[1].primary is PendingCode.NO_CAPACITY


def test_unreachable_pools_refuse_with_their_reason() -> None:
    e = estate_of([host("box"), slurm("hpc")], [resource("1-gpu", "box", "hpc", gpus=1)])
    reports = {"hpc": PoolState("hpc", reachable=False, reason="ssh: connection refused")}
    out = place(SchedulerInput(e, [queued(1)], [], reports, now=0.0))
    assert out.placements == []
    assert out.pending[1].pools == {
        "box": "unreachable: no report from the pool this cycle",
        "hpc": "unreachable: ssh: connection refused",
    }


# -- no head-of-line blocking -----------------------------------------------------------------


def test_a_task_that_does_not_fit_holds_back_nobody_else() -> None:
    e = estate_of(
        [host("box", gpus=4), slurm("hpc", max_queued=0)],
        [
            resource("4-gpu", "box", gpus=4),
            resource("1-gpu", "box", gpus=1),
            resource("cpu", "hpc"),
        ],
    )
    busy = [running(9, "box")]
    tasks = [
        queued(1, "4-gpu"),
        queued(2, "1-gpu", team="b"),
        queued(3, "1-gpu"),
        queued(4, "cpu", team="c"),
    ]
    out = cycle(e, tasks, busy, hpc=PoolState("hpc", free_slots=1))
    assert where(out) == {2: "box", 3: "box", 4: "hpc"}
    assert out.pending[1].pools == {"box": "needs 4 GPUs, 1 free"}


# -- spill-over -------------------------------------------------------------------------------


def _spill_estate() -> Estate:
    return estate_of(
        [slurm("hpc", max_wait_s=600), host("box")], [resource("1-gpu", "hpc", "box", gpus=1)]
    )


def test_a_task_waiting_past_max_wait_is_withdrawn() -> None:
    late = ActiveTask(1, "u", "a", "1-gpu", "hpc", False, since=300.0)
    fresh = ActiveTask(2, "u", "a", "1-gpu", "hpc", False, since=500.0)
    out = cycle(_spill_estate(), [], [late, fresh], now=1000.0)
    assert out.withdrawals == [1]
    assert out.pending[1].pools == {
        "hpc": "waited past max_wait (600 s); withdrawn to try the next pool"
    }
    assert out.pending[2].primary is PendingCode.POOL_QUEUE


def test_a_withdrawn_task_goes_to_the_next_pool() -> None:
    out = cycle(_spill_estate(), [queued(1, skip_pools=frozenset({"hpc"}))])
    assert where(out) == {1: "box"}


def test_no_withdrawal_when_no_other_pool_can_be_tried() -> None:
    late = ActiveTask(1, "u", "a", "1-gpu", "hpc", False, 0.0, skip_pools=frozenset({"box"}))
    assert cycle(_spill_estate(), [], [late]).withdrawals == []
    off = {"hpc": PoolState("hpc"), "box": PoolState("box", reachable=False)}
    stuck = ActiveTask(2, "u", "a", "1-gpu", "hpc", False, 0.0)
    out = place(SchedulerInput(_spill_estate(), [], [stuck], off, now=1000.0))
    assert out.withdrawals == []


def test_a_task_withdrawn_from_every_pool_starts_over() -> None:
    out = cycle(_spill_estate(), [queued(1, skip_pools=frozenset({"hpc", "box"}))])
    assert where(out) == {1: "hpc"}


# -- why is it waiting? -----------------------------------------------------------------------


def each_reason_cycle() -> SchedulerOutput:
    """A cycle in which task 1 is placed and every other waits for a reason of its own: 2 for
    capacity, 3 over its team's limit, 4 not in its team's policy, 5 in no team, 7 in the
    pool's own queue."""
    e = estate_of(
        [slurm("hpc", max_queued=1), host("box", gpus=0)],
        [resource("1-gpu", "hpc", gpus=1), resource("8-gpu", "hpc", gpus=8)],
        [Policy("a", ("1-gpu",), limit={"1-gpu": 3})],
    )
    waiting = ActiveTask(7, "u", "a", "1-gpu", "hpc", False, 990.0, native_reason="Resources")
    tasks = [queued(1), queued(2), queued(3), queued(4, "8-gpu"), queued(5, team=None)]
    return cycle(e, tasks, [waiting], hpc=PoolState("hpc", free_gpus=1))


def test_each_pending_task_gets_the_first_reason_that_applies() -> None:
    out = each_reason_cycle()
    codes = {task_id: reason.primary for task_id, reason in out.pending.items()}
    assert where(out) == {1: "hpc"}
    assert codes == {
        2: PendingCode.NO_CAPACITY,
        3: PendingCode.OVER_LIMIT,
        4: PendingCode.NOT_PERMITTED,
        5: PendingCode.NOT_PERMITTED,
        7: PendingCode.POOL_QUEUE,
    }
    assert (
        out.pending[3].detail
        == "team a's limit of 3 × 1-gpu is taken by its active and earlier tasks"
    )
    assert out.pending[4].detail == "team a's policy does not list 8-gpu"
    assert out.pending[7].pools == {"hpc": "waiting in its queue (Resources)"}


def test_breakdown_names_room_held_by_borrowers() -> None:
    e = estate_of(
        [host("box", gpus=8, slots=16)],
        [resource("2-gpu", "box", gpus=2), resource("1-gpu", "box", gpus=1)],
    )
    borrowers = [running(10 + i, "box", team="b", borrowed=True) for i in range(6)]
    others = [running(20 + i, "box", team="c") for i in range(2)]
    out = cycle(e, [queued(1, "2-gpu")], borrowers + others)
    assert out.pending[1].pools == {"box": "needs 2 GPUs, 0 free, 6 held by borrowers"}


def test_reasons_are_the_same_each_cycle_while_nothing_changes() -> None:
    e = estate_of(
        [host("box", gpus=2), slurm("hpc", max_queued=1)],
        [resource("1-gpu", "box", "hpc", gpus=1), resource("2-gpu", "box", gpus=2)],
        [Policy("a", ("1-gpu", "2-gpu"), limit={"1-gpu": 4}), Policy("b", ("1-gpu",))],
    )
    active = [
        running(50, "box"),
        running(51, "box", team="b"),
        ActiveTask(52, "u", "b", "1-gpu", "hpc", False, 900.0),
    ]
    tasks = [queued(i, "1-gpu" if i % 3 else "2-gpu", team="ab"[i % 2]) for i in range(1, 30)]
    first = cycle(e, tasks, active, now=1000.0)
    for now in (1005.0, 1010.0, 1015.0):
        again = cycle(e, list(reversed(tasks)), active, now=now)
        assert again.pending == first.pending
        assert again.placements == first.placements
