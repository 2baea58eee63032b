"""`klique agent --pool NAME --server URL`: one pool's agent as its own process on the pool's
login node. It builds its driver from its pool's part of the server's estate (the pool, the
compute resources that name it: broker/agent_estate.py), pulls the pool's tasks, submits,
polls and reports over the agent API (broker/api/agents.py); the control plane keeps
placement, policies and the ledger. The agent is the same PoolAgent that runs inside a server:
only its ControlPlane is remote. Killed at any point, it restarts and adopts its jobs by tag.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from broker.domain import Task, TaskState
from broker.errors import KliqueError, TransportError
from broker.estate import parse_estate
from broker.pools.base import Context, Observation
from broker.pools.registry import make_driver
from broker.scheduler.agent import PoolAgent
from broker.scheduler.link import Accepted, Attempt, Begun
from broker.scheduler.placement import PoolState
from broker.scheduler.wire import (
    observation_to_json,
    pool_state_to_json,
    task_from_json,
)

log = logging.getLogger("klique.agent")


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


async def serve_pool(pool: str, server: str, token: str, home: Path) -> None:
    """Run the pool's agent until SIGTERM or SIGINT."""
    from broker.server import build_runner

    link = HttpLink(server, token, pool)
    estate = parse_estate(await _retrying(link.estate_text), f"{server} estate")
    if pool not in estate.pools:
        raise KliqueError(f"the estate at {server} has no pool {pool!r}")
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    context = Context(estate, home, build_runner(home), api_url=server)
    settings = estate.pools[pool].settings
    driver = make_driver(estate.pools[pool], context)
    interval = min(float(str(settings.get("poll_interval") or 10)), 1.0)
    agent = PoolAgent(
        pool, driver, link, interval, int(str(settings.get("submit_concurrency") or 8))
    )
    for problem in await driver.check():
        log.error("pool %s: %s", pool, problem)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("serving pool %s for %s", pool, server)
    try:
        await agent.run(stop)
    finally:
        await driver.close()
        await link.close()


def _detail(response: httpx.Response) -> str:
    """The server's own sentence, where it answered one."""
    try:
        return str(response.json()["detail"])
    except (ValueError, KeyError, TypeError):
        return response.text[:300]


async def _retrying(fetch: Any) -> Any:
    """The first answer of the control plane, waiting for it with backoff (it may restart)."""
    delay = 1.0
    while True:
        try:
            return await fetch()
        except TransportError as exc:
            log.warning("waiting for the control plane: %s", exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)


def install_helper(path: Path, config: Path | None = None) -> Path:
    """Copy the helper program (broker/helper.py) to `path`, readable and runnable by all and
    writable by this account only; for a sudoers rule it must be owned by root. `config` fixes
    where the copy reads its job roots (helper.CONFIG by default): never from its caller."""
    from broker import helper

    source = Path(helper.__file__).read_bytes()
    if config is not None:
        fixed = f"CONFIG = {str(config.absolute())!r}\n".encode()
        source = source.replace(f'CONFIG = "{helper.CONFIG}"\n'.encode(), fixed, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(source)
    tmp.chmod(0o755)
    tmp.replace(path)
    return path
