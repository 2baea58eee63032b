"""One factory for pool agents: the server's own agents and `klique agent` on a login node are
built here alike, from the pool's settings; only the link to the control plane and the longest
wait between looks differ."""

from __future__ import annotations

from pathlib import Path

from broker.agents.link import ControlPlane
from broker.agents.pool_agent import PoolAgent
from broker.domain import Estate, Pool
from broker.pools.base import Context, PoolDriver
from broker.pools.registry import make_driver
from broker.pools.settings import poll_interval_s, serves_remotely, submit_concurrency
from inside_job.zipapp import build

REMOTE_LOOK_S = 1.0  # `klique agent` looks at its pool at least this often


def build_runner(home: Path) -> Path:
    """The runner zipapp that jobs run, built once per start under `home`."""
    folder = home / "runner"
    folder.mkdir(parents=True, exist_ok=True)
    return build(folder / "klique-runner.pyz")


def driver_context(estate: Estate, home: Path, api_url: str | None) -> Context:
    """What drivers need from the process that runs them, its runner built."""
    return Context(estate=estate, home=home, runner=build_runner(home), api_url=api_url)


def build_drivers(estate: Estate, context: Context) -> dict[str, PoolDriver]:
    """A driver for each pool this process serves: those not served by `klique agent`."""
    return {
        name: make_driver(pool, context)
        for name, pool in estate.pools.items()
        if not serves_remotely(pool)  # served by `klique agent` on its login node
    }


def look_interval_s(pool: Pool, most_s: float) -> float:
    """How long the agent waits between looks with nothing to do: a queueing pool's poll
    interval, never longer than `most_s`; `most_s` for a pool of fixed slots."""
    if not pool.queueing:
        return most_s
    return min(poll_interval_s(pool) or most_s, most_s)


def build_agent(pool: Pool, driver: PoolDriver, link: ControlPlane, most_s: float) -> PoolAgent:
    """The pool's agent over its driver, reporting through `link`."""
    interval = look_interval_s(pool, most_s)
    return PoolAgent(pool.name, driver, link, interval, submit_concurrency(pool))
