"""The agent API: what `klique agent --pool NAME` on a login node reads and reports. An agent
token (broker/api/agent_tokens.py: it expires, and can be revoked) acts only for the pools it
names, and only on those pools' tasks; every report goes through the same StoreLink (and so
the same state machine) as an agent inside the server."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Response
from fastapi import Path as PathParam
from pydantic import BaseModel, Field

from broker.agents.estate_view import agent_estate
from broker.agents.link import Accepted, Attempt, Begun
from broker.agents.wire import observation_from_json, pool_state_from_json, task_to_json
from broker.api.agent_tasks import EncodedTasks
from broker.api.agent_tokens import agent_pools_of, token_router
from broker.authz import check_agent_pool
from broker.control.loop import ControlLoop
from broker.domain import Task, TaskState
from broker.names import LINE, NAME

log = logging.getLogger("klique.server")

PoolName = Annotated[str, PathParam(pattern=NAME)]
Reason = Annotated[str, Field(max_length=4000, pattern=LINE)]
TaskId = Annotated[int, Field(ge=1, lt=2**63)]
Native = Annotated[str, Field(max_length=200, pattern=LINE)]
Folder = Annotated[str, Field(max_length=4096, pattern=r"^/[^\x00-\x1f\x7f]*$")]


AGENT_CHOSEN_DIGEST = (
    "begin takes no digest: the control plane makes each attempt's report token and returns "
    "it in begin's result (`report_token`); upgrade `klique agent` to this server's version"
)


def begun_to_json(begun: Begun) -> dict[str, Any]:
    """A begun attempt as begin answers it: the task, and the report token made for it."""
    return {**task_to_json(begun.task), "report_token": begun.token}


class ObservationIn(BaseModel):
    state: TaskState
    reason: Reason = ""
    exit_code: int | None = Field(None, ge=-(2**31), lt=2**31)
    preempted: bool = False
    native_id: Native | None = None
    job_dir: Folder | None = None
    phase: Literal["", "configuring", "suspended"] = ""
    charged: bool = True
    retry: bool = False
    requeued: bool = False


class PoolStateIn(BaseModel):
    free_slots: int | None = Field(None, ge=0, lt=2**31)
    free_gpus: float = Field(0.0, ge=0, allow_inf_nan=False)
    free_cpus: int | None = Field(None, ge=0, lt=2**31)
    queued: int = Field(0, ge=0, lt=2**31)
    reachable: bool = True
    reason: Reason = ""
    last_good: float | None = Field(None, allow_inf_nan=False)
    free_nodes: int | None = Field(None, ge=0, lt=2**31)  # idle nodes, where counted
    # Placed tasks whose submission's reply was lost, and why they wait (`klique why`).
    outcome_unknown: dict[TaskId, Reason] = Field({}, max_length=10000)
    # The agent's counts since it started, shown by /metrics (broker/metrics.py).
    looks: int = Field(0, ge=0, lt=2**63)
    status_queries: int = Field(0, ge=0, lt=2**63)


class AgentCall(BaseModel):
    """One report of an agent (see broker/agents/link.py, ControlPlane)."""

    op: Literal["begin", "submitted", "observed", "requeue", "refused", "cancelled", "published"]
    task_id: TaskId | None = None
    job_dir: Folder | None = None
    # Refused when set: the control plane makes each attempt's report token (begin's result).
    digest: str | None = Field(None, max_length=200)
    native_id: Native | None = None
    observation: ObservationIn | None = None
    reason: Reason = ""
    skip: bool = False
    only_from: list[TaskState] = Field([], max_length=16)
    state: PoolStateIn | None = None
    strangers: list[Native] = Field([], max_length=10000)


class AgentCalls(BaseModel):
    calls: list[AgentCall] = Field(max_length=10000)


def _answers(tasks: list[Task | None], found: list[Any], missing: Any) -> list[Any]:
    """One answer per call, in order: the link's for the pool's tasks, `missing` for others."""
    given = iter(found)
    return [missing if task is None else next(given) for task in tasks]


def agent_router(control: ControlLoop, admin_only: Callable[..., Any]) -> APIRouter:
    router = APIRouter(prefix="/api/v1")
    store = control.store
    link = control.link

    agent_pools = agent_pools_of(control)
    encoded = EncodedTasks()
    router.include_router(token_router(control, admin_only))

    def may_serve(pool: str, pools: list[str]) -> None:
        check_agent_pool(pools, pool, control.remote)

    @router.get("/agent/pools/{pool}")
    def pool_estate(
        pool: PoolName,
        pools: list[str] = Depends(agent_pools),  # noqa: B008
    ) -> dict[str, str]:
        """The estate the agent builds its driver from: its pool's alone
        (broker/agents/estate_view.py), nothing of other pools, teams, policies or identity
        settings."""
        may_serve(pool, pools)
        return {"pool": pool, "estate": agent_estate(control.estate, pool)}

    @router.get("/agent/pools/{pool}/tasks", response_model=list[dict[str, Any]])
    def pool_tasks(
        pool: PoolName,
        pools: list[str] = Depends(agent_pools),  # noqa: B008
    ) -> Response:
        """The pool's tasks: placed, submitted, pending, running; with their intents."""
        may_serve(pool, pools)
        body = encoded.body(pool, control.link.held.current(pool))
        return Response(body, media_type="application/json")

    @router.post("/agent/pools/{pool}/calls")
    async def pool_calls(
        pool: PoolName,
        body: AgentCalls,
        pools: list[str] = Depends(agent_pools),  # noqa: B008
    ) -> dict[str, list[Any]]:
        """The agent's reports, in order; one result each. A batch's attempts (begin), accepted
        jobs (submitted) and a look's observations (observed) in a row are recorded together."""
        may_serve(pool, pools)
        results: list[Any] = []
        for op, run in itertools.groupby(body.calls, key=lambda call: call.op):
            calls = list(run)
            if op in ("begin", "submitted", "observed"):
                results += await _apply_batch(pool, op, calls)
            else:
                results += [await _apply(pool, call) for call in calls]
        return {"results": results}

    async def _pool_tasks(pool: str, calls: list[AgentCall]) -> list[Task | None]:
        """The calls' tasks; None for one that is not in the pool. A task leaves its pool while
        an agent's report is on its way (cancelled, requeued, spilled over): its call is answered
        as the in-process link answers a task that moved on, and the rest of the batch stands.
        Another pool's task and one that does not exist get the same None: no oracle of ids."""
        ids = [call.task_id for call in calls if call.task_id is not None]
        if len(ids) < len(calls):
            raise HTTPException(422, f"{calls[0].op} needs task_id")
        found = await asyncio.to_thread(store.tasks, ids=ids, pool=pool)
        in_pool = {task.id: task for task in found}
        gone = [task_id for task_id in ids if task_id not in in_pool]
        if gone:
            log.info("pool %s reported on tasks no longer in it: %s", pool, gone[:20])
        return [in_pool.get(task_id) for task_id in ids]

    async def _apply_batch(pool: str, op: str, calls: list[AgentCall]) -> list[Any]:
        tasks = await _pool_tasks(pool, calls)
        pairs = [(t, c) for t, c in zip(tasks, calls, strict=True) if t is not None]
        if op == "submitted":
            accepted = await link.submitted([Accepted(t, c.native_id, c.job_dir) for t, c in pairs])
            return _answers(tasks, accepted, False)
        if op == "observed":
            seen = [c.observation for c in calls if c.observation is not None]
            if len(seen) < len(calls):
                raise HTTPException(422, "observed needs observation")
            news = [
                (t, observation_from_json(o.model_dump()))
                for t, o in zip(tasks, seen, strict=True)
                if t is not None
            ]
            await link.observed(news)
            return [None] * len(calls)
        if any(call.digest is not None for call in calls):
            raise HTTPException(422, AGENT_CHOSEN_DIGEST)
        if any(call.job_dir is None for call in calls):
            raise HTTPException(422, "begin needs job_dir")
        begun = await link.begin([Attempt(t, str(c.job_dir)) for t, c in pairs])
        return _answers(tasks, [None if b is None else begun_to_json(b) for b in begun], None)

    async def _apply(pool: str, call: AgentCall) -> Any:
        if call.op == "published":
            state = call.state or PoolStateIn()
            seen = pool_state_from_json({"name": pool, **state.model_dump()})
            await asyncio.to_thread(control.published, pool, seen, set(call.strangers))
            return None
        [task] = await _pool_tasks(pool, [call])
        if task is None:
            return None
        if call.op == "requeue":
            await link.requeue(task, call.reason, skip=call.skip, only_from=call.only_from)
        elif call.op == "refused":
            await link.refused(task, call.reason)
        elif call.op == "cancelled":
            await link.cancelled(task, call.reason)
        return None

    return router
