"""Nothing lost, nothing doubled: faults at chosen points on the real Slurm cluster.

Each test runs one scenario of chaos_scenarios.py (bench/chaos.py runs the same ones) and
asserts that Slurm's own job list shows exactly one job per task, that every task ended in the
state its command calls for, and that none was lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_scenarios import agent_crashes, control_plane_crashes, network_cut
from chaos_scenarios import (
    Outcome,
    array_crash,
    cluster_min_job_age,
    controller_outage,
    controller_up,
    crash_and_restart,
    foreign_tag,
    fresh_postgres_schema,
    hard_kills,
    lost_submit_replies,
    short_min_job_age,
    slurm_script,
    ssh_drops,
    store_crash,
)

pytestmark = [pytest.mark.chaos, pytest.mark.slurm]


def check(outcome: Outcome) -> None:
    assert outcome.clean, outcome.explain()


@pytest.fixture
def cluster(slurm_cluster: Any) -> Iterator[Any]:
    """The cluster, left as it was found: slurmctld running, MinJobAge at its default (the
    scenarios restore both themselves; this catches a scenario that could not). `make test`
    gives these scenarios a cluster of their own (scripts/run-tests); bench/chaos.py and a
    plain pytest use the shared one."""
    yield slurm_cluster
    if not controller_up():
        slurm_script("slurm-ctl", "start", "slurmctld")
    if cluster_min_job_age() != 300:
        slurm_script("slurm-up", "--restart", env={"KLIQUE_SLURM_MIN_JOB_AGE": "300"})


@pytest.mark.slurm
def test_sigkill_at_many_points_loses_and_doubles_nothing(cluster: Any, tmp_path: Path) -> None:
    check(crash_and_restart(tmp_path))


@pytest.mark.slurm
def test_sigkill_during_job_array_submissions_loses_and_doubles_no_element(
    cluster: Any, tmp_path: Path
) -> None:
    check(array_crash(tmp_path))


@pytest.mark.slurm
def test_a_foreign_job_with_a_tasks_tag_is_never_adopted(cluster: Any, tmp_path: Path) -> None:
    check(foreign_tag(tmp_path))


@pytest.mark.slurm
def test_sbatch_replies_lost_after_slurmctld_queued_the_jobs_double_and_lose_nothing(
    cluster: Any, tmp_path: Path
) -> None:
    check(lost_submit_replies(tmp_path))


@pytest.mark.slurm
def test_slurmctld_down_for_45_s_fails_no_task(cluster: Any, tmp_path: Path) -> None:
    check(controller_outage(tmp_path))


@pytest.mark.slurm
@pytest.mark.ssh
def test_ssh_connections_killed_during_submission(cluster: Any, sshd: Any, tmp_path: Path) -> None:
    check(ssh_drops(tmp_path))


def test_a_remote_agent_killed_at_many_points_loses_and_doubles_nothing(
    cluster: Any, tmp_path: Path
) -> None:
    check(agent_crashes(tmp_path))


def test_the_control_plane_killed_while_an_agent_runs_loses_and_doubles_nothing(
    cluster: Any, tmp_path: Path
) -> None:
    check(control_plane_crashes(tmp_path))


def test_a_minute_without_network_between_agent_and_control_plane_fails_no_task(
    cluster: Any, tmp_path: Path
) -> None:
    check(network_cut(tmp_path))


@pytest.mark.slurm
def test_a_job_killed_hard_ends_lost_with_a_reason(cluster: Any, tmp_path: Path) -> None:
    check(hard_kills(tmp_path))


@pytest.mark.slurm
def test_min_job_age_2_keeps_every_final_state_right(cluster: Any, tmp_path: Path) -> None:
    check(short_min_job_age(tmp_path))


def test_a_crash_inside_a_state_change_leaves_the_previous_state_on_sqlite(
    tmp_path: Path,
) -> None:
    check(store_crash(f"sqlite:///{tmp_path / 'klique.db'}", "sqlite"))


@pytest.mark.postgres
def test_a_crash_inside_a_state_change_leaves_the_previous_state_on_postgresql(
    postgres_url: str,
) -> None:
    url, drop = fresh_postgres_schema(postgres_url)
    try:
        check(store_crash(url, "postgresql"))
    finally:
        drop()


def test_a_listing_older_than_the_runners_own_report_is_ignored(tmp_path: Path) -> None:
    """The status listing said PENDING; the runner reported RUNNING before the cycle wrote it:
    the stale word is dropped instead of failing the cycle (and every task in it)."""
    from broker.control.store_link import StoreLink
    from broker.domain import TaskSpec, TaskState
    from broker.estate import parse_estate
    from broker.execution import Observation
    from broker.store.repository import Store

    estate = parse_estate(
        "resources:\n  cpu:\n    profile: {cpus: 1, memory: 1G, walltime: 1h, pools: [p]}\n"
        "pools:\n  p: {kind: host, slots: 1}\n"
    )
    store = Store.open(f"sqlite:///{tmp_path / 'klique.db'}")
    try:
        task = store.create_task(TaskSpec(("true",), "cpu"), "alice", None)
        for state in (TaskState.PLACED, TaskState.SUBMITTED, TaskState.PENDING):
            store.change_state(task.id, state, pool="p")
        seen_by_the_cycle = store.get(task.id)
        store.change_state(task.id, TaskState.RUNNING)  # the runner's report, meanwhile
        link = StoreLink(store, estate)
        asyncio.run(link.observed([(seen_by_the_cycle, Observation(TaskState.PENDING, "pending"))]))
        assert store.get(task.id).state is TaskState.RUNNING
        asyncio.run(
            link.observed([(seen_by_the_cycle, Observation(TaskState.COMPLETED, "done", 0))])
        )
        assert store.get(task.id).state is TaskState.COMPLETED
    finally:
        store.close()
