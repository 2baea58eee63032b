"""The control plane over the agent API (broker/api/agent_link.py), as the ControlPlane protocol
(broker/agents/link.py) says: the link of `klique agent` on a login node."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from broker.agents.link import Accepted, Attempt, Begun
from broker.agents.wire import observation_to_json, pool_state_to_json, task_from_json
from broker.domain import Task, TaskState
from broker.errors import KliqueError, TransportError
from broker.execution import Observation, PoolState


class TokenRefused(KliqueError):
    """The control plane refused the agent's token (unknown, expired or revoked): no retry can
    help, and the server's answer says how to get a new one."""


class HttpLink:
    """The control plane over the agent API, as the ControlPlane protocol says."""

    def __init__(self, server: str, token: str, pool: str, timeout: float = 30.0) -> None:
        self.pool = pool
        self.http = httpx.AsyncClient(
            base_url=f"{server.rstrip('/')}/api/v1/agent/pools",
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
        )

    async def close(self) -> None:
        await self.http.aclose()

    async def _request(self, method: str, path: str, body: Any = None) -> Any:
        try:
            response = await self.http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise TransportError(f"the control plane did not answer: {exc!r}") from exc
        if response.status_code == 401:
            raise TokenRefused(f"the control plane refused this agent's token: {_detail(response)}")
        if response.status_code >= 400:
            raise TransportError(
                f"the control plane refused {method} {path}: "
                f"{response.status_code} {response.text[:300]}"
            )
        try:
            return response.json()
        except ValueError as exc:
            raise TransportError(f"the control plane answered {path} with no JSON") from exc

    async def estate_text(self) -> str:
        return str((await self._request("GET", f"/{self.pool}"))["estate"])

    async def _call(self, op: str, **fields: Any) -> Any:
        [result] = await self._calls([{"op": op, **fields}])
        return result

    async def _calls(self, calls: list[dict[str, Any]]) -> list[Any]:
        """Several reports in one request, applied in order; one result each."""
        if not calls:
            return []
        results = await self._request("POST", f"/{self.pool}/calls", {"calls": calls})
        return list(results["results"])

    async def holding(self, pool: str) -> list[Task]:
        return [task_from_json(t) for t in await self._request("GET", f"/{self.pool}/tasks")]

    async def begin(self, attempts: Sequence[Attempt]) -> list[Begun | None]:
        calls = [{"op": "begin", "task_id": a.task.id, "job_dir": a.job_dir} for a in attempts]
        return [
            None if t is None else Begun(task_from_json(t), str(t["report_token"]))
            for t in await self._calls(calls)
        ]

    async def submitted(self, accepted: Sequence[Accepted]) -> list[bool]:
        calls = [
            {"op": "submitted", "task_id": task.id, "native_id": native_id, "job_dir": job_dir}
            for task, native_id, job_dir in accepted
        ]
        return [bool(kept) for kept in await self._calls(calls)]

    async def observed(self, news: Sequence[tuple[Task, Observation]]) -> None:
        calls = [
            {"op": "observed", "task_id": task.id, "observation": observation_to_json(seen)}
            for task, seen in news
        ]
        await self._calls(calls)

    async def requeue(
        self, task: Task, reason: str, *, skip: bool, only_from: Sequence[TaskState]
    ) -> None:
        only = [s.value for s in only_from]
        await self._call("requeue", task_id=task.id, reason=reason, skip=skip, only_from=only)

    async def refused(self, task: Task, reason: str) -> None:
        await self._call("refused", task_id=task.id, reason=reason)

    async def cancelled(self, task: Task, reason: str) -> None:
        await self._call("cancelled", task_id=task.id, reason=reason)

    async def published(self, pool: str, state: PoolState, strangers: Sequence[str]) -> None:
        fields = pool_state_to_json(state)
        fields.pop("name", None)
        await self._call("published", state=fields, strangers=list(strangers))


def _detail(response: httpx.Response) -> str:
    """The server's own sentence, where it answered one."""
    try:
        return str(response.json()["detail"])
    except (ValueError, KeyError, TypeError):
        return response.text[:300]
