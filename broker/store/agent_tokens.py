"""The store's agent tokens: what `klique agent` on a login node speaks with. Each names the
pools it serves and ends: at its expiry, or at once when revoked. Secrets are kept as SHA-256
digests; an id (`agent-` and the digest's start) names a token in listings and revocations."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select

from broker.errors import NotFound
from broker.names import AGENT_ID_PREFIX
from broker.store.repository import Store, add_token_row, find_token_row
from broker.store.tables import AgentTokenRow


@dataclass(frozen=True)
class AgentTokenInfo:
    """What is kept of an agent token (never the token itself)."""

    id: str
    pools: tuple[str, ...]
    expires_at: float
    revoked: bool
    last_used_at: float | None
    created_at: float

    def expired(self, now: float) -> bool:
        return now >= self.expires_at


class AgentTokens:
    def __init__(self, store: Store) -> None:
        self.store = store

    def add(self, pools: Sequence[str], expires_at: float) -> tuple[str, AgentTokenInfo]:
        """A new random token (256 bits) for these pools, and what is kept of it."""
        return add_token_row(
            self.store,
            AgentTokenRow,
            _info,
            id_prefix=AGENT_ID_PREFIX,
            pools=json.dumps(sorted(set(pools))),
            expires_at=expires_at,
        )

    def find(self, token: str) -> AgentTokenInfo | None:
        """What is kept of `token`, revoked and expired ones too (the caller says which); its
        use is noted at most once a minute."""
        return find_token_row(self.store, AgentTokenRow, token, _info)

    def all(self) -> list[AgentTokenInfo]:
        query = select(AgentTokenRow).order_by(AgentTokenRow.created_at)
        with self.store._sessions() as session:
            return [_info(row) for row in session.scalars(query)]

    def revoke(self, token_id: str) -> AgentTokenInfo:
        """Revoke the agent token with this id: its next call is refused."""
        with self.store._tx() as session:
            row = session.scalar(select(AgentTokenRow).where(AgentTokenRow.id == token_id))
            if row is None:
                raise NotFound(f"no agent token {token_id}; `klique token ls` lists them")
            row.revoked = True
            return _info(row)


def _info(row: AgentTokenRow) -> AgentTokenInfo:
    return AgentTokenInfo(
        id=row.id,
        pools=tuple(json.loads(row.pools)),
        expires_at=row.expires_at,
        revoked=row.revoked,
        last_used_at=row.last_used_at,
        created_at=row.created_at,
    )
