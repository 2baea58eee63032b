"""A `klique agent` whose pool lost a submission's reply says so with its pool's state: the
words its driver keeps for `klique why` travel over the wire to the control plane, where a
remote pool has no driver to ask."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from test_slurm_site_settings import slurm_pool
from test_submit_outcome_unknown import JOB_DIR, Slurm, placed

from broker.agents.factory import build_agent
from broker.agents.link import Accepted, Attempt, Begun
from broker.agents.wire import pool_state_from_json, pool_state_to_json
from broker.api.agent_link import PoolStateIn
from broker.domain import Task, TaskState
from broker.errors import SubmitUnknown
from broker.execution import Observation, PoolState


class Recording:
    """The control plane as an agent sees it: the pool holds `tasks`; what it publishes is
    kept."""

    def __init__(self, tasks: list[Task]) -> None:
        self.tasks = tasks
        self.states: list[PoolState] = []

    async def holding(self, pool: str) -> list[Task]:
        return self.tasks

    async def begin(self, attempts: Sequence[Attempt]) -> list[Begun | None]:
        return [Begun(a.task, "token") for a in attempts]

    async def submitted(self, accepted: Sequence[Accepted]) -> list[bool]:
        return [True] * len(accepted)

    async def observed(self, news: Sequence[tuple[Task, Observation]]) -> None:
        return None

    async def requeue(self, task: Task, reason: str, **_: Any) -> None:
        return None

    async def refused(self, task: Task, reason: str) -> None:
        return None

    async def cancelled(self, task: Task, reason: str) -> None:
        return None

    async def published(self, pool: str, state: PoolState, strangers: Sequence[str]) -> None:
        self.states.append(state)


def _over_the_wire(state: PoolState) -> PoolState:
    """As HttpLink sends it and the agent API reads it back."""
    sent = json.loads(json.dumps(pool_state_to_json(state)))
    sent.pop("name")
    return pool_state_from_json({"name": state.name, **PoolStateIn(**sent).model_dump()})


def test_an_agent_publishes_why_a_placed_task_waits_after_a_lost_reply():
    driver, _, estate = slurm_pool(
        Slurm(sbatch="Unable to contact slurm controller (receive failure)")
    )
    task = placed(estate)
    with pytest.raises(SubmitUnknown):
        asyncio.run(driver.submit(task, "token"))
    running = replace(task, id=8, state=TaskState.RUNNING, native_id="22", job_dir=JOB_DIR + "x")
    link = Recording([task, running])
    agent = build_agent(estate.pools["p"], driver, link, 1.0)
    asyncio.run(agent.step())
    published = _over_the_wire(link.states[-1])
    assert set(published.outcome_unknown) == {task.id}
    words = published.outcome_unknown[task.id]
    assert "receive failure" in words and "looks for its tag twice" in words
    assert words == driver.outcome_unknown(task.id)
