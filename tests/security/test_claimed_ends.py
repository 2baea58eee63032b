"""A runner's claimed end makes its pool ask the scheduler sooner, never more: however often
a job repeats its claim, and however many jobs claim at once, the scheduler is asked at most
once a second, and a claim the scheduler does not confirm is asked for less and less often
(docs/job-directory.md, SECURITY.md section 7)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers.scripted_transport import ScriptedTransport

from broker.agents import pool_agent
from broker.agents.pool_agent import PoolAgent
from broker.agents.timing import CONFIRM_S
from broker.domain import Task, TaskState
from broker.estate import parse_estate
from broker.pools import batch
from broker.pools.base import Context
from broker.pools.pbs import PbsDriver
from broker.preview import sample_task
from broker.transport import Completed

INTERVAL_S = 60.0
STEP_S = 0.1
CLAIM = {"exit_code": 0, "outcome": "completed", "reason": "done (or so it says)"}


class Clock:
    """The `time` module of the agent and the batch driver, with a monotonic clock that the
    test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def still_running(argv: list[str], account: str) -> Completed:
    """Torque's qstat -f: every job named is still running, whatever its runner claims."""
    jobs = [a for a in argv if a.endswith(".tq")]
    return Completed(
        0,
        "".join(
            f"Job Id: {j}\n    Job_Name = klique-{j[:-3]}\n    job_state = R\n\n" for j in jobs
        ),
        "",
    )


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> tuple[PoolAgent, ScriptedTransport, Any, Clock]:
    estate = parse_estate(
        f"""
resources:
  r: {{profile: {{pools: [p], cpus: 1, walltime: 1h}}}}
pools:
  p: {{kind: pbs, dialect: torque, job_root: /jobs, poll_interval: {INTERVAL_S:g}s,
      user_map: {{bob: bob}}}}
"""
    )
    clock = Clock()
    monkeypatch.setattr(batch, "time", clock)
    monkeypatch.setattr(pool_agent, "time", clock)
    transport = ScriptedTransport(still_running)
    context = Context(estate, Path("."), Path("klique-runner.pyz"), None)
    driver = PbsDriver(estate.pools["p"], context, transport)
    # The agent's clock times the pool's queries; `ask` is its look's question to the pool
    # (no link: `ask` reports nothing).
    agent = PoolAgent("p", driver, link=None, interval_s=0.5)  # type: ignore[arg-type]
    return agent, transport, estate, clock


def running(estate: Any, task_id: int, claimed: bool) -> Task:
    task = replace(
        sample_task(estate, "r", "bob"),
        id=task_id,
        state=TaskState.RUNNING,
        native_id=f"{task_id}.tq",
        job_dir=f"/jobs/klique-{task_id}",
    )
    return replace(task, claim=dict(CLAIM)) if claimed else task


def query_times(transport: ScriptedTransport, times: list[float], clock: Clock) -> None:
    """Notes the clock whenever a poll asked the scheduler about jobs."""
    asked = [argv for argv, _ in transport.calls if argv[0] == "qstat" and "-B" not in argv]
    if len(asked) > len(times):
        times.append(clock.now)


def test_a_job_repeating_its_claim_gets_fewer_and_fewer_queries(pool) -> None:
    agent, transport, estate, clock = pool
    asked: list[float] = []
    asyncio.run(agent.ask([running(estate, 1, claimed=False)]))  # the first look
    query_times(transport, asked, clock)
    start = clock.now
    for _ in range(int(INTERVAL_S / STEP_S)):  # a minute of claims repeated at every look
        clock.now += STEP_S
        asyncio.run(agent.ask([running(estate, 1, claimed=True)]))
        query_times(transport, asked, clock)
    gaps = [round(b - a, 1) for a, b in zip(asked, asked[1:], strict=False)]
    assert gaps[:2] == [CONFIRM_S, CONFIRM_S], gaps  # the claim is looked for soon, twice
    later = gaps[1:]
    assert all(b >= 2 * a - STEP_S for a, b in zip(later, later[1:], strict=False)), gaps
    assert len(asked) <= 7, [round(t - start, 1) for t in asked]  # against 1 at the interval


def test_many_jobs_claiming_at_once_get_one_query_a_second(pool) -> None:
    agent, transport, estate, clock = pool
    asked: list[float] = []
    asyncio.run(agent.ask([running(estate, i, claimed=False) for i in range(1, 201)]))
    query_times(transport, asked, clock)
    for step in range(200):  # a new task claims its end at every look, for 20 s
        clock.now += STEP_S
        tasks = [running(estate, i, claimed=i <= step + 1) for i in range(1, 201)]
        asyncio.run(agent.ask(tasks))
        query_times(transport, asked, clock)
    gaps = [b - a for a, b in zip(asked, asked[1:], strict=False)]
    assert gaps and min(gaps) >= CONFIRM_S - 1e-9, gaps
    assert len(asked) <= 1 + 200 * STEP_S / CONFIRM_S


def test_the_agent_is_told_to_look_when_the_next_query_may_come_and_no_sooner(pool) -> None:
    """The agent looks again when the pool may be asked (a second after its last query), so a
    claim that comes 0.4 s after a query is asked about 0.6 s later, and never sooner."""
    agent, transport, estate, clock = pool
    asked: list[float] = []
    asyncio.run(agent.ask([running(estate, 1, claimed=False)]))
    query_times(transport, asked, clock)
    assert agent.clock.confirm_in(frozenset(), clock.now) is None
    clock.now += 0.4
    wait = agent.clock.confirm_in(frozenset({1}), clock.now)
    assert wait == pytest.approx(CONFIRM_S - 0.4)
    asyncio.run(agent.ask([running(estate, 1, claimed=True)]))  # the report's own look
    query_times(transport, asked, clock)
    assert len(asked) == 1  # too soon: not asked
    clock.now += wait
    assert agent.clock.confirm_in(frozenset({1}), clock.now) == 0.0
    asyncio.run(agent.ask([running(estate, 1, claimed=True)]))
    query_times(transport, asked, clock)
    assert [round(t - asked[0], 6) for t in asked] == [0.0, CONFIRM_S]
    # still running at that query: the next comes a second after it, then twice as far
    assert agent.clock.confirm_in(frozenset({1}), clock.now) == pytest.approx(CONFIRM_S)
    clock.now += CONFIRM_S
    asyncio.run(agent.ask([running(estate, 1, claimed=True)]))
    assert agent.clock.confirm_in(frozenset({1}), clock.now) == pytest.approx(2 * CONFIRM_S)
