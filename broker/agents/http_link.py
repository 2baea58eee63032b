"""The control plane over the agent API (broker/api/agent_link.py), as the ControlPlane protocol
(broker/agents/link.py) says: the link of `klique agent` on a login node. The server may be
one URL (one server, or the replicas' public URL behind a load balancer) or a comma-separated
list of replicas' URLs, which the link follows: a request that could not connect goes to the
next at once, and after any other failure of a replica the next request does."""

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
        self.servers = server_urls(server)
        self.current = 0  # the replica the last request reached, or the next to try
        self.http = httpx.AsyncClient(
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
        )

    async def close(self) -> None:
        await self.http.aclose()

    async def _send(self, method: str, path: str, body: Any) -> httpx.Response:
        """The request to the current replica; to the next ones while none could be reached
        (nothing was sent: safe to send again). Any other failure moves the next request on:
        a request that may have been applied is never sent twice."""
        for _ in self.servers:
            base = f"{self.servers[self.current]}/api/v1/agent/pools"
            try:
                return await self.http.request(method, base + path, json=body)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                failure: httpx.HTTPError = exc
                self.current = (self.current + 1) % len(self.servers)
            except httpx.HTTPError as exc:
                self.current = (self.current + 1) % len(self.servers)
                raise TransportError(f"the control plane did not answer: {exc!r}") from exc
        raise TransportError(f"the control plane did not answer: {failure!r}") from failure

    async def _request(self, method: str, path: str, body: Any = None) -> Any:
        response = await self._send(method, path, body)
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


def server_urls(server: str) -> list[str]:
    """--server as the list of URLs it names (one, or the replicas' comma-separated)."""
    urls = [url.strip().rstrip("/") for url in server.split(",") if url.strip()]
    if not urls:
        raise KliqueError("--server names no URL; fix: give the control plane's URL")
    return urls


def _detail(response: httpx.Response) -> str:
    """The server's own sentence, where it answered one."""
    try:
        return str(response.json()["detail"])
    except (ValueError, KeyError, TypeError):
        return response.text[:300]
