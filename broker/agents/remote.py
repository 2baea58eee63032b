"""`klique agent --pool NAME --server URL`: one pool's agent as its own process on the pool's
login node. It builds its driver from its pool's part of the server's estate (the pool, the
compute resources that name it: broker/agents/estate_view.py), pulls the pool's tasks, submits,
polls and reports over the agent API (broker/api/agent_link.py); the control plane keeps
placement, policies and the ledger. The agent is the same PoolAgent that runs inside a server,
built by the same factory (broker/agents/factory.py): only its ControlPlane is remote. Killed at
any point, it restarts and adopts its jobs by tag.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Any

from broker.agents.factory import REMOTE_LOOK_S, build_agent, driver_context
from broker.agents.http_link import HttpLink
from broker.errors import KliqueError, TransportError
from broker.estate import parse_estate
from broker.pools.registry import make_driver

log = logging.getLogger("klique.agent")


async def serve_pool(pool: str, server: str, token: str, home: Path) -> None:
    """Run the pool's agent until SIGTERM or SIGINT."""
    link = HttpLink(server, token, pool)
    estate = parse_estate(await _retrying(link.estate_text), f"{server} estate")
    if pool not in estate.pools:
        raise KliqueError(f"the estate at {server} has no pool {pool!r}")
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Jobs report to one URL: the first (the replicas' public URL, where there is one).
    api_url = link.servers[0]
    driver = make_driver(estate.pools[pool], driver_context(estate, home, api_url=api_url))
    agent = build_agent(estate.pools[pool], driver, link, REMOTE_LOOK_S)
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
