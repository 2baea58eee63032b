"""The REST API's endpoints about the server and the estate: health, who is calling, compute
resources, pools, usage, and a policy simulation."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from broker.control.loop import ControlLoop
from broker.http.callers import Auth
from broker.http.paths import API
from broker.tasks.overview import resources_out, simulation_out, usage_out
from broker.tasks.schemas import PoolOut, ResourceOut, SimulateRequest, SimulationOut, UsageOut
from broker.usage import UsageKey


def estate_router(control: ControlLoop) -> APIRouter:
    router = APIRouter(prefix=API)

    @router.get("/health")
    def health() -> dict[str, Any]:
        """Up; placement cycles run, and each pool agent's looks at its pool."""
        looks = {name: agent.looks for name, agent in control.agents.items()}
        return {"ok": True, "cycles": control.cycles, "looks": looks}

    @router.get("/whoami")
    def whoami(who: Auth) -> dict[str, Any]:
        return {
            "user": who.user,
            "admin": who.admin,
            "team": who.team,
            "kind": who.kind,
            "scopes": sorted(who.scopes),
            "via": who.via,
        }

    @router.get("/resources")
    def resources(who: Auth) -> list[ResourceOut]:
        return resources_out(control.estate, who)

    @router.get("/pools")
    def pools(who: Auth) -> list[PoolOut]:
        return [
            PoolOut.of(p, control.snapshots().get(p.name), control.strangers(p.name))
            for p in control.estate.pools.values()
        ]

    @router.get("/usage")
    def usage(who: Auth, by: UsageKey = "team", since: float | None = None) -> UsageOut:
        """GPU-seconds and wall seconds from the ledger; admins see everyone, users themselves."""
        return usage_out(control.store, who, by, since)

    @router.post("/policy/simulate")
    def policy_simulate(body: SimulateRequest, who: Auth) -> SimulationOut:
        """One placement cycle of the current queue under a changed estate; changes nothing."""
        return simulation_out(control.store, control.snapshots(), body, who)

    return router
