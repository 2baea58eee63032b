"""The estate as one pool's agent sees it (`GET /api/v1/agent/pools/P`): an agent token on a
login node reads what its pool's driver needs, and nothing of other pools, teams, policies,
identity settings, apps or routes."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from broker.domain import Estate
from broker.errors import NotFound

# The estate-wide settings a pool's driver reads: templates (broker/pools/batch.py,
# kubernetes.py) and the owner's mail address that templates may name.
DRIVER_SETTINGS = ("templates_dir", "mail_domain")


def serving_resources(estate: Estate, pool: str) -> list[str]:
    """The compute resources whose profile names `pool`: the only ones its tasks can ask for."""
    return [name for name, r in estate.resources.items() if pool in r.profile.pools]


def agent_estate(estate: Estate, pool: str) -> str:
    """An estate file for `pool`'s agent alone, built from the server's validated estate: the
    pool's entry as written (with its own user map), each compute resource that names the pool
    (its profile listing that pool alone), and DRIVER_SETTINGS. The agent parses it as it would
    the whole file, so every unit and default means the same on both sides."""
    resources = serving_resources(estate, pool)
    if pool not in estate.pools or not resources:
        raise NotFound(
            f"no compute resource names pool {pool!r}, so its agent has nothing to run; fix: "
            "list the pool in a compute resource's profile pools"
        )
    written: dict[str, Any] = yaml.safe_load(estate.text)
    narrowed: dict[str, Any] = {
        key: written[key] for key in DRIVER_SETTINGS if written.get(key) is not None
    }
    narrowed["resources"] = {
        name: _for_pool(written["resources"][name], pool) for name in resources
    }
    narrowed["pools"] = {pool: written["pools"][pool]}
    return yaml.safe_dump(narrowed, sort_keys=False)


def _for_pool(resource: dict[str, Any], pool: str) -> dict[str, Any]:
    """A compute resource as written, naming `pool` alone: the others are not the agent's."""
    mine = copy.deepcopy(resource)
    mine["profile"]["pools"] = [pool]
    return mine
