"""One placement cycle over 100,000 queued tasks, 1,000 pools and 200 teams, and its growth.

Prints a table (cycle_s is the best of several runs) and, last, one JSON line for 100k tasks.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

from broker.domain import ComputeResource, Estate, Policy, Pool, Profile
from broker.execution import PoolState
from broker.scheduler.placement import (
    ActiveTask,
    QueuedTask,
    SchedulerInput,
    SchedulerOutput,
    place,
)

SITES = 25  # 40 pools each: 24 hosts, 16 queueing pools
TEAMS = 200
SIZES: dict[str, dict[str, Any]] = {
    "1-gpu": {"gpus": 1},
    "2-gpu": {"gpus": 2},
    "4-gpu": {"gpus": 4},
    "8-gpu": {"gpus": 8},
    "half-gpu": {"gpu_fraction": 0.5},
    "eighth-gpu": {"gpu_fraction": 0.125},
    "20g": {"gpu_memory_mb": 20_000},
    "cpu": {},
}
NOW = 1_000_000.0


def build_estate(rng: random.Random) -> Estate:
    pools: dict[str, Pool] = {}
    resources: dict[str, ComputeResource] = {}
    for site in range(SITES):
        names = [_pool(pools, site, i) for i in range(40)]
        for k, (size, profile) in enumerate(SIZES.items()):
            order = tuple(names[(5 * k + j) % 40] for j in range(10))
            name = f"{size}@{site}"
            resources[name] = ComputeResource(name, Profile(pools=order, **profile))
    policies = {f"t{t}": _policy(rng, t, sorted(resources)) for t in range(TEAMS)}
    return Estate(resources, pools, policies, {}, fair_share_half_life_s=7 * 86400.0)


def _pool(pools: dict[str, Pool], site: int, i: int) -> str:
    name = f"s{site}-p{i}"
    if i < 24:
        pools[name] = Pool(name, "host", slots=16, gpus=8, gpu_memory_mb=80_000)
    else:
        kind = ("slurm", "pbs", "lsf")[i % 3]
        pools[name] = Pool(name, kind, max_queued=20, max_wait_s=1800)
    return name


def _policy(rng: random.Random, team: int, resources: list[str]) -> Policy:
    site = team % SITES
    mine = tuple(
        r for r in resources if r.endswith(f"@{site}") or r.endswith(f"@{(site + 1) % SITES}")
    )
    limit = {r: rng.randint(10, 60) for r in mine if rng.random() < 0.5}
    reservation = {f"1-gpu@{site}": 2} if team < SITES * 2 else {}
    limit.update({r: max(limit.get(r, 0), n) for r, n in reservation.items()})
    return Policy(f"t{team}", mine, reservation, limit, priority=rng.randint(0, 3))


def pool_states(rng: random.Random, estate: Estate) -> dict[str, PoolState]:
    states = {}
    for name, pool in estate.pools.items():
        if pool.queueing:
            states[name] = PoolState(
                name, free_gpus=rng.choice([0, 0, 2, 8]), queued=rng.randint(0, 10)
            )
        else:
            states[name] = PoolState(name, reachable=rng.random() > 0.01, reason="ssh refused")
    return states


def tasks(rng: random.Random, estate: Estate, n: int, first_id: int) -> list[QueuedTask]:
    out = []
    for i in range(n):
        team = f"t{rng.randrange(TEAMS)}"
        policy = estate.policies[team]
        resource = rng.choice(policy.resources)
        at = NOW - rng.uniform(0, 5000)  # some older than starvation_s: they pin hosts
        out.append(QueuedTask(first_id + i, f"u{i % 997}", team, resource, at))
    return out


def running(estate: Estate, states: dict[str, PoolState], rng: random.Random) -> list[ActiveTask]:
    """Fill about half the estate with running tasks, placed by the scheduler itself."""
    warm = tasks(rng, estate, 12_000, first_id=10_000_000)
    by_id = {t.id: t for t in warm}
    out = place(SchedulerInput(estate, warm, [], states, now=NOW - 3600))
    return [
        ActiveTask(
            d.task_id,
            "u",
            by_id[d.task_id].team,
            by_id[d.task_id].resource,
            d.pool,
            True,
            NOW - rng.uniform(0, 3600),
            d.borrowed,
            d.gpus,
        )
        for d in out.placements
    ]


def one_cycle(inputs: SchedulerInput, repeat: int) -> tuple[float, SchedulerOutput]:
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = place(inputs)
        times.append(time.perf_counter() - start)
    assert out is not None
    return min(times), out  # the least disturbed run: other work on the machine only adds


def main() -> None:
    rng = random.Random(7)
    estate = build_estate(rng)
    states = pool_states(rng, estate)
    active = running(estate, states, rng)
    usage = {team: rng.uniform(0, 1e6) for team in estate.policies}
    queue = tasks(rng, estate, 100_000, first_id=1)
    print(
        f"pools {len(estate.pools)}, teams {len(estate.policies)}, "
        f"compute resources {len(estate.resources)}, running {len(active)}"
    )
    row = "{:>8} {:>9} {:>7} {:>17} {:>17}"
    print(row.format("tasks", "cycle_s", "placed", "placements_per_s", "s_per_task_vs_1k"))
    base = None
    result = {}
    for n in (1_000, 3_000, 10_000, 30_000, 100_000):
        inputs = SchedulerInput(estate, queue[:n], active, states, usage, NOW)
        cycle_s, out = one_cycle(inputs, repeat=5 if n < 100_000 else 3)
        per_task = cycle_s / n
        base = base or per_task
        rate = len(out.placements) / cycle_s
        cells = (f"{cycle_s:.3f}", len(out.placements), f"{rate:.0f}", f"{per_task / base:.2f}")
        print(row.format(n, *cells))
        result = {
            "tasks": n,
            "pools": len(estate.pools),
            "teams": len(estate.policies),
            "cycle_s": round(cycle_s, 4),
            "placements_per_s": round(rate, 1),
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
