"""Two replicas on one PostgreSQL behind nginx, a storm of creates on the real Slurm cluster,
the leader SIGKILLed once and cut from the database once (failover_scenarios.py; the long run
is bench/failover.py): the other leads within the lease's time, and against Slurm's records no
task is doubled, lost or ended wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chaos_scenarios import fresh_postgres_schema
from failover_scenarios import failover

pytestmark = [pytest.mark.chaos, pytest.mark.slurm, pytest.mark.postgres]

TTL = 5.0  # shorter than the default (8 s), to keep the scenario short


def test_a_killed_and_a_cut_leader_are_replaced_within_the_lease_and_nothing_is_doubled_or_lost(
    slurm_cluster: Any, postgres_url: str, tmp_path: Path
) -> None:
    url, drop = fresh_postgres_schema(postgres_url)
    try:
        result = failover(tmp_path, url, tasks=24, faults=("kill", "cut"), ttl_s=TTL, seed=40)
    finally:
        drop()
    outcome = result.outcome
    assert outcome.clean, outcome.explain()
    for takeover in result.takeovers:
        assert takeover.seconds < TTL + 3.0, outcome.line()
