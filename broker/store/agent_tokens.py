"""The store's agent tokens: what `klique agent` on a login node speaks with. Each names the
pools it serves and ends: at its expiry, or at once when revoked. Secrets are kept as SHA-256
digests; an id (`agent-` and the digest's start) names a token in listings and revocations."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select

from broker.errors import NotFound
from broker.names import AGENT_ID_PREFIX
from broker.store.repository import Store, token_digest
from broker.store.tables import AgentTokenRow

# How often a token's last use is written: an agent calls every few seconds.
_TOUCH_EVERY_S = 60.0


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
        token = secrets.token_urlsafe(32)
        digest = token_digest(token)
        row = AgentTokenRow(
            digest=digest,
            id=AGENT_ID_PREFIX + digest[:16],
            pools=json.dumps(sorted(set(pools))),
            expires_at=expires_at,
            revoked=False,
            created_at=time.time(),
        )
        with self.store._tx() as session:
            session.add(row)
            session.flush()
            return token, _info(row)

    def find(self, token: str) -> AgentTokenInfo | None:
        """What is kept of `token`, revoked and expired ones too (the caller says which); its
        use is noted at most once a minute."""
        digest = token_digest(token)
        with self.store._sessions() as session:
            row = session.get(AgentTokenRow, digest)
            if row is None:
                return None
            found = _info(row)
        now = time.time()
        if found.last_used_at is None or now - found.last_used_at > _TOUCH_EVERY_S:
            with self.store._tx() as session:
                row = session.get(AgentTokenRow, digest)
                if row is not None:
                    row.last_used_at = now
        return found

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
