"""Agent tokens: made, listed and revoked by admins (`klique token create-agent`, `ls`,
`revoke`), and checked on every call of the agent API. A token serves the pools it names until
it expires (90 days unless made with --expires) or is revoked; then its next call gets 401 with
the way to a new one."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field

from broker.control.loop import ControlLoop
from broker.errors import NotFound
from broker.http.callers import bearer
from broker.names import AGENT_ID, NAME
from broker.store.identity import AgentTokens
from broker.store.rows import AgentTokenInfo

DEFAULT_LIFETIME_S = 90 * 86400
# A token that outlives a year is one nobody remembers to rotate.
MAX_LIFETIME_S = 366 * 86400
AgentTokenId = Annotated[str, PathParam(pattern=AGENT_ID, description="An agent token's id.")]


class AgentTokenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pools: list[Annotated[str, Field(pattern=NAME)]] = Field(min_length=1, max_length=100)
    expires_in: int = Field(
        DEFAULT_LIFETIME_S, ge=1, le=MAX_LIFETIME_S, description="Seconds (at most 366 days)."
    )


class AgentTokenOut(BaseModel):
    """An agent token as `klique token ls` shows it: never the token itself."""

    id: str
    kind: str = "agent"
    pools: list[str]
    expires_at: float
    revoked: bool
    last_used_at: float | None
    created_at: float

    @classmethod
    def of(cls, info: AgentTokenInfo) -> AgentTokenOut:
        return cls(
            id=info.id,
            pools=list(info.pools),
            expires_at=info.expires_at,
            revoked=info.revoked,
            last_used_at=info.last_used_at,
            created_at=info.created_at,
        )


class AgentTokenMade(AgentTokenOut):
    token: str


def refusal(found: AgentTokenInfo | None, now: float) -> str | None:
    """Why the agent API refuses a token (None: it is in force), with the way to a new one."""
    if found is None:
        return f"missing or unknown agent token; fix: {_new_token('--pool POOL')}"
    pools = " ".join(f"--pool {p}" for p in found.pools)
    if found.revoked:
        return f"agent token {found.id} was revoked; fix: {_new_token(pools)}"
    if found.expired(now):
        ended = dt.datetime.fromtimestamp(found.expires_at, dt.UTC).strftime("%Y-%m-%d %H:%M")
        return f"agent token {found.id} expired at {ended} UTC; fix: {_new_token(pools)}"
    return None


def _new_token(pools: str) -> str:
    return (
        f"an admin makes a new one with `klique token create-agent {pools}` and the agent reads "
        "it from --token-file or $KLIQUE_AGENT_TOKEN"
    )


def token_router(control: ControlLoop, admin_only: Callable[..., Any]) -> APIRouter:
    """The admins' routes: make, list and revoke agent tokens."""
    router = APIRouter()
    tokens = AgentTokens(control.store)

    @router.post("/agent-tokens", status_code=201)
    def create_agent_token(
        body: AgentTokenRequest,
        _admin: Any = Depends(admin_only),  # noqa: B008
    ) -> AgentTokenMade:
        unknown = [p for p in body.pools if p not in control.remote]
        if unknown:
            raise NotFound(
                f"no remote pool {', '.join(unknown)}; an agent token serves pools declared with "
                "`agent: remote` in the estate"
            )
        token, info = tokens.add(body.pools, time.time() + body.expires_in)
        return AgentTokenMade(**AgentTokenOut.of(info).model_dump(), token=token)

    @router.get("/agent-tokens")
    def list_agent_tokens(_admin: Any = Depends(admin_only)) -> list[AgentTokenOut]:  # noqa: B008
        """Every agent token, revoked and expired ones too; never the tokens themselves."""
        return [AgentTokenOut.of(info) for info in tokens.all()]

    @router.post("/agent-tokens/{token_id}/revoke")
    def revoke_agent_token(
        token_id: AgentTokenId,
        _admin: Any = Depends(admin_only),  # noqa: B008
    ) -> AgentTokenOut:
        """Revoke an agent token: its agent's next call is refused."""
        return AgentTokenOut.of(tokens.revoke(token_id))

    return router


def agent_pools_of(control: ControlLoop) -> Callable[..., list[str]]:
    """The dependency of every agent API route: the pools the caller's agent token serves, or
    401 saying why the token is not in force. Looked up on every call, so that a revocation
    takes effect at once."""
    tokens = AgentTokens(control.store)

    def agent_pools(authorization: Annotated[str | None, Header()] = None) -> list[str]:
        token = bearer(authorization)
        found = tokens.find(token) if token else None
        problem = refusal(found, time.time())
        if problem is not None or found is None:
            raise HTTPException(401, problem)
        return list(found.pools)

    return agent_pools
