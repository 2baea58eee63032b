"""Policies in placement on plain data: reservations, limits, priority, fair share, reclaim,
starvation; and a property test that no cycle breaks a limit or overfills a host.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.domain import ComputeResource, Estate, Policy, Pool, Profile
from broker.execution import PoolState
from broker.scheduler.placement import (
    ActiveTask,
    PendingCode,
    QueuedTask,
    SchedulerInput,
    SchedulerOutput,
    SchedulerSettings,
    place,
)

NOW = 10_000.0


def box_estate(gpus: int = 8, policies: Sequence[Policy] = ()) -> Estate:
    resources = [
        ComputeResource("1-gpu", Profile(pools=("box",), gpus=1)),
        ComputeResource("8-gpu", Profile(pools=("box",), gpus=8)),
    ]
    pools = [Pool("box", "host", slots=2 * gpus, gpus=gpus)]
    return Estate(
        resources={r.name: r for r in resources},
        pools={p.name: p for p in pools},
        policies={p.team: p for p in policies},
        teams={},
    )


def queued(task_id: int, team: str, at: float = 0.0, resource: str = "1-gpu") -> QueuedTask:
    return QueuedTask(task_id, f"user{task_id}", team, resource, at)


def run(task_id: int, team: str, since: float = 0.0, **kw: Any) -> ActiveTask:
    return ActiveTask(
        task_id, "someone", team, "1-gpu", "box", True, since, gpus=(task_id % 8,), **kw
    )


def cycle(
    estate: Estate,
    tasks: Sequence[QueuedTask],
    active: Sequence[ActiveTask] = (),
    usage: dict[str, float] | None = None,
    now: float = NOW,
    **knobs: Any,
) -> SchedulerOutput:
    states = {name: PoolState(name) for name in estate.pools}
    inputs = SchedulerInput(
        estate, tasks, active, states, usage or {}, now, SchedulerSettings(**knobs)
    )
    return place(inputs)


def placed_by_team(out: SchedulerOutput, tasks: Sequence[QueuedTask]) -> Counter[str | None]:
    team = {t.id: t.team for t in tasks}
    return Counter(team[d.task_id] for d in out.placements)


RESERVED = [
    Policy("r", ("1-gpu",), reservation={"1-gpu": 4}, limit={"1-gpu": 8}),
    Policy("b", ("1-gpu",), priority=5),
]


# -- reservations -----------------------------------------------------------------------------


def test_a_reservation_is_honoured_under_load_from_another_team() -> None:
    flood = [queued(i, "b", at=0.0) for i in range(1, 21)]
    mine = [queued(100 + i, "r", at=50.0) for i in range(4)]
    out = cycle(box_estate(policies=RESERVED), flood + mine)
    assert placed_by_team(out, flood + mine) == {"r": 4, "b": 4}
    assert not any(d.borrowed for d in out.placements)


def test_an_unused_reservation_is_lent_and_marked_borrowed() -> None:
    flood = [queued(i, "b") for i in range(1, 21)]
    out = cycle(box_estate(policies=RESERVED), flood)
    assert len(out.placements) == 8
    assert [d.borrowed for d in out.placements] == [False] * 4 + [True] * 4


def test_held_room_is_lent_only_when_no_other_pool_has_room() -> None:
    one_gpu = ComputeResource("1-gpu", Profile(pools=("box", "box2"), gpus=1))
    pools = {n: Pool(n, "host", slots=4, gpus=2) for n in ("box", "box2")}
    policies = [Policy("r", ("1-gpu",), reservation={"1-gpu": 2}), Policy("b", ("1-gpu",))]
    estate = Estate({"1-gpu": one_gpu}, pools, {p.team: p for p in policies}, {})
    states = {n: PoolState(n) for n in pools}
    out = place(SchedulerInput(estate, [queued(i, "b", at=NOW) for i in (1, 2, 3)], [], states))
    assert [(d.pool, d.borrowed) for d in out.placements] == [
        ("box2", False),
        ("box2", False),
        ("box", True),
    ]


def test_a_reservation_gives_first_pick_of_a_queueing_pool() -> None:
    hpc = Pool("hpc", "slurm", queueing=True, max_queued=2)
    estate = Estate(
        {"1-gpu": ComputeResource("1-gpu", Profile(pools=("hpc",), gpus=1))},
        {"hpc": hpc},
        {p.team: p for p in RESERVED},
        {},
    )
    tasks = [queued(i, "b", at=NOW - 100) for i in range(1, 6)] + [queued(9, "r", at=NOW)]
    out = place(SchedulerInput(estate, tasks, [], {"hpc": PoolState("hpc")}, now=NOW))
    assert [(d.task_id, d.borrowed) for d in out.placements] == [(9, False), (1, False)]


# -- limits, priority, fair share -------------------------------------------------------------


def test_a_limit_caps_the_team_across_running_and_new_tasks() -> None:
    policies = [Policy("a", ("1-gpu",), limit={"1-gpu": 3})]
    out = cycle(box_estate(policies=policies), [queued(i, "a") for i in range(1, 6)], [run(9, "a")])
    assert len(out.placements) == 2
    assert {out.pending[i].primary for i in (3, 4, 5)} == {PendingCode.OVER_LIMIT}


def test_priority_orders_teams_for_surplus() -> None:
    policies = [Policy("lo", ("1-gpu",), priority=0), Policy("hi", ("1-gpu",), priority=10)]
    tasks = [
        queued(1, "lo", at=NOW - 200),
        queued(2, "lo", at=NOW - 199),
        queued(3, "hi", at=NOW - 101),
    ]
    tasks += [queued(4, "hi", at=NOW - 100)]
    out = cycle(box_estate(gpus=3, policies=policies), tasks)
    assert [d.task_id for d in out.placements] == [3, 4, 1]


def test_fair_share_breaks_priority_ties_by_decayed_usage() -> None:
    policies = [Policy("a", ("1-gpu",)), Policy("b", ("1-gpu",))]
    tasks = [
        queued(1, "a", at=NOW - 200),
        queued(2, "a", at=NOW - 199),
        queued(3, "b", at=NOW - 150),
    ]
    tasks += [queued(4, "b", at=NOW - 149)]
    out = cycle(box_estate(gpus=2, policies=policies), tasks, usage={"a": 5e6, "b": 1e3})
    assert [d.task_id for d in out.placements] == [3, 4]


def test_age_breaks_fair_share_ties() -> None:
    policies = [Policy("a", ("1-gpu",)), Policy("b", ("1-gpu",))]
    tasks = [
        queued(1, "a", at=NOW - 195),
        queued(2, "b", at=NOW - 199),
        queued(3, "a", at=NOW - 198),
    ]
    out = cycle(box_estate(gpus=2, policies=policies), tasks, usage={"a": 10.0, "b": 10.0})
    assert [d.task_id for d in out.placements] == [2, 3]


# -- reclaim ----------------------------------------------------------------------------------


def _lenders(since: float = 0.0) -> list[ActiveTask]:
    """Team b on all 8 GPUs, the last four on room reserved for team r."""
    return [run(i, "b", since=since + i, borrowed=i >= 4) for i in range(8)]


def test_borrowed_runs_are_preempted_for_the_reservation_newest_first() -> None:
    mine = [queued(100, "r", at=NOW - 300), queued(101, "r", at=NOW - 300)]
    out = cycle(box_estate(policies=RESERVED), mine, _lenders())
    assert out.preemptions == [7, 6]
    assert {out.pending[t.id].primary for t in mine} == {PendingCode.RECLAIM}


def test_runs_being_stopped_are_not_preempted_again() -> None:
    mine = [queued(100, "r", at=NOW - 300), queued(101, "r", at=NOW - 300)]
    first = cycle(box_estate(policies=RESERVED), mine, _lenders())
    stopping = [
        run(a.id, "b", a.since, borrowed=a.borrowed, preempted=a.id in first.preemptions)
        for a in _lenders()
    ]
    again = cycle(box_estate(policies=RESERVED), mine, stopping, now=NOW + 5)
    assert again.preemptions == []
    assert again.pending == first.pending


def test_nobody_is_preempted_before_the_minimum_run_time() -> None:
    mine = [queued(100, "r", at=NOW - 300)]
    out = cycle(box_estate(policies=RESERVED), mine, _lenders(since=NOW - 100), min_run_s=600)
    assert out.preemptions == []
    assert out.pending[100].primary is PendingCode.RECLAIM
    later = cycle(box_estate(policies=RESERVED), mine, _lenders(since=NOW - 100), now=NOW + 600)
    assert later.preemptions == [7]


def test_a_task_waits_the_grace_period_before_it_preempts() -> None:
    mine = [queued(100, "r", at=NOW - 10)]
    assert cycle(box_estate(policies=RESERVED), mine, _lenders(), grace_s=120).preemptions == []
    assert cycle(box_estate(policies=RESERVED), mine, _lenders(), grace_s=5).preemptions == [7]


def test_preemptions_per_cycle_are_capped() -> None:
    mine = [queued(100 + i, "r", at=0.0) for i in range(4)]
    out = cycle(box_estate(policies=RESERVED), mine, _lenders(), max_preemptions_per_cycle=3)
    assert out.preemptions == [7, 6, 5]
    assert {out.pending[t.id].primary for t in mine} == {PendingCode.RECLAIM}


def test_the_lowest_priority_borrower_goes_first() -> None:
    policies = [*RESERVED, Policy("c", ("1-gpu",), priority=0)]
    lenders = [run(i, "b", since=i, borrowed=i >= 4) for i in range(7)]
    lenders.append(run(7, "c", since=0.0, borrowed=True))
    out = cycle(box_estate(policies=policies), [queued(100, "r", at=0.0)], lenders)
    assert out.preemptions == [7]


def test_runs_that_did_not_borrow_are_never_preempted() -> None:
    steady = [run(i, "b", since=0.0) for i in range(8)]
    out = cycle(box_estate(policies=RESERVED), [queued(100, "r", at=0.0)], steady)
    assert out.preemptions == []
    assert out.pending[100].primary is PendingCode.NO_CAPACITY


# -- starvation -------------------------------------------------------------------------------


def _first_start_of_big_task(starvation_s: float, cycles: int = 120) -> int | None:
    """Cycles every minute; team small sends two 5-minute 1-GPU tasks per cycle, forever."""
    policies = [Policy("small", ("1-gpu",), priority=1), Policy("big", ("8-gpu",))]
    estate = box_estate(policies=policies)
    queue = [queued(1, "big", resource="8-gpu")]
    active: list[ActiveTask] = []
    for n in range(cycles):
        now = n * 60.0
        active = [a for a in active if a.since + 300.0 > now]
        queue += [queued(1000 + 2 * n + k, "small", at=now) for k in range(2)]
        out = cycle(estate, queue, active, now=now, starvation_s=starvation_s)
        placed = {d.task_id: d for d in out.placements}
        for task in queue:
            if task.id in placed:
                gpus = placed[task.id].gpus
                active.append(
                    ActiveTask(task.id, "u", task.team, task.resource, "box", True, now, gpus=gpus)
                )
        queue = [t for t in queue if t.id not in placed]
        if 1 in placed:
            return n
    return None


def test_a_large_task_that_keeps_losing_still_starts() -> None:
    assert _first_start_of_big_task(starvation_s=float("inf")) is None  # the stream starves it
    started = _first_start_of_big_task(starvation_s=900.0)
    assert started is not None and started <= 15 + 6


def test_a_pinned_pool_says_whom_it_is_kept_for() -> None:
    policies = [Policy("small", ("1-gpu",)), Policy("big", ("8-gpu",))]
    active = [run(i, "small") for i in range(4)]
    tasks = [queued(1, "big", at=0.0, resource="8-gpu"), queued(2, "small", at=NOW - 1)]
    out = cycle(box_estate(policies=policies), tasks, active, starvation_s=3600)
    assert out.placements == []
    assert out.pending[2].pools == {"box": "kept free for task 1, which has waited longest"}
    assert out.pending[1].pools == {
        "box": "needs 8 GPUs, 4 free; kept free for this task until it fits"
    }
    later = cycle(box_estate(policies=policies), tasks, active, now=NOW + 30, starvation_s=3600)
    assert later.pending == out.pending


# -- property: limits and capacity always hold ------------------------------------------------

RESOURCES = {
    "1-gpu": {"gpus": 1},
    "half": {"gpu_fraction": 0.5},
    "2-gpu": {"gpus": 2},
    "quarter": {"gpu_fraction": 0.25},
    "30g": {"gpu_memory_mb": 30_000},
}
POOLS = ("h1", "h2", "hpc")


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Estate, dict[str, PoolState], list[QueuedTask]]:
    pools = [
        Pool(
            name,
            "host",
            slots=draw(st.integers(1, 6)),
            gpus=draw(st.integers(0, 4)),
            gpu_memory_mb=40_000,
        )
        for name in ("h1", "h2")
    ]
    pools.append(Pool("hpc", "slurm", queueing=True, max_queued=draw(st.integers(0, 3))))
    resources = {
        name: ComputeResource(
            name,
            Profile(pools=tuple(draw(st.permutations(POOLS))[: draw(st.integers(1, 3))]), **kw),
        )
        for name, kw in RESOURCES.items()
    }
    policies = {team: draw(_policies(team)) for team in ("a", "b", "c")}
    states = {p.name: PoolState(p.name) for p in pools}
    states["hpc"] = PoolState(
        "hpc", free_gpus=draw(st.sampled_from([0.0, 0.5, 1.0, 3.0])), queued=draw(st.integers(0, 3))
    )
    estate = Estate(resources, {p.name: p for p in pools}, policies, {})
    tasks = [
        QueuedTask(
            i,
            "u",
            draw(st.sampled_from(["a", "b", "c", None])),
            draw(st.sampled_from(sorted(RESOURCES))),
            float(draw(st.integers(0, 50))),
        )
        for i in range(draw(st.integers(0, 30)))
    ]
    return estate, states, tasks


@st.composite
def _policies(draw: st.DrawFn, team: str) -> Policy:
    allowed = tuple(r for r in sorted(RESOURCES) if draw(st.booleans()))
    limit = {r: draw(st.integers(0, 4)) for r in allowed if draw(st.booleans())}
    reservation = {r: draw(st.integers(0, limit.get(r, 3))) for r in allowed if draw(st.booleans())}
    return Policy(team, allowed, reservation, limit, draw(st.integers(0, 2)))


def _as_active(out: SchedulerOutput, tasks: Sequence[QueuedTask], now: float) -> list[ActiveTask]:
    by_id = {t.id: t for t in tasks}
    return [
        ActiveTask(
            d.task_id,
            "u",
            by_id[d.task_id].team,
            by_id[d.task_id].resource,
            d.pool,
            True,
            now,
            d.borrowed,
            d.gpus,
        )
        for d in out.placements
    ]


def _check(
    estate: Estate, tasks: Sequence[QueuedTask], active: list[ActiveTask], out: SchedulerOutput
) -> None:
    placed = {d.task_id for d in out.placements}
    assert len(placed) == len(out.placements)
    assert {t.id for t in tasks} == placed | (set(out.pending) & {t.id for t in tasks})
    assert not placed & set(out.pending)
    now_active = active + _as_active(out, tasks, NOW)
    count = Counter((a.team, a.resource) for a in now_active)
    before = Counter((a.team, a.resource) for a in active)
    for (team, resource), n in count.items():
        assert estate.permitted(team, resource) or n == before[(team, resource)]
        limit = estate.policies[team].limit.get(resource) if team in estate.policies else None
        if limit is not None:
            assert n <= max(limit, before[(team, resource)])
    for name in ("h1", "h2"):
        _check_host(estate, estate.pools[name], [a for a in now_active if a.pool == name])
    assert all(not d.borrowed for d in out.placements if d.pool == "hpc")


def _check_host(estate: Estate, pool: Pool, runs: list[ActiveTask]) -> None:
    assert len(runs) <= pool.slots
    load = [0.0] * pool.gpus
    for a in runs:
        profile = estate.resources[a.resource].profile
        share = profile.gpu_fraction or (profile.gpu_memory_mb or 0) / pool.gpu_memory_mb or 1.0
        for gpu in a.gpus:
            load[gpu] += share
    assert all(x <= 1.0 + 1e-9 for x in load)


@settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(scenarios(), st.data())
def test_no_cycle_breaks_a_limit_or_overfills_a_host(scenario: Any, data: st.DataObject) -> None:
    estate, states, tasks = scenario
    first = place(SchedulerInput(estate, tasks, [], states, now=NOW))
    _check(estate, tasks, [], first)
    active = _as_active(first, tasks, NOW)
    more = [
        QueuedTask(100 + i, "u", data.draw(st.sampled_from(["a", "b", "c"])), "1-gpu", NOW)
        for i in range(data.draw(st.integers(0, 10)))
    ]
    rest = [t for t in tasks if t.id in first.pending] + more
    second = place(SchedulerInput(estate, rest, active, states, now=NOW + 60))
    _check(estate, rest, active, second)
