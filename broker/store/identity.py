"""The store's identity half, every token and session query in one place: Klique's tokens
(users, service users, admins), the agents' tokens (`klique agent` on a login node) and browser
sessions. Secrets are kept as SHA-256 digests; the caller compares nothing itself."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from sqlalchemy import delete, func, select

from broker.errors import NotFound
from broker.names import AGENT_ID_PREFIX
from broker.store.repository import Store
from broker.store.rows import (
    AgentTokenInfo,
    SessionInfo,
    TokenInfo,
    agent_token_of,
    session_of,
    token_of,
)
from broker.store.tables import AgentTokenRow, SessionRow, TokenRow

# What each kind of Klique token may do unless it is made with scopes of its own.
KIND_SCOPES = {"admin": ("admin", "read", "submit"), "user": ("read", "submit")}

# How often a token's last use is written: a write per use would queue every reader.
TOKEN_TOUCH_EVERY_S = 60.0

# The tables of tokens: Klique's (users, service users, admins) and the agents'.
TokenTable = TypeVar("TokenTable", TokenRow, AgentTokenRow)
Kept = TypeVar("Kept")


def token_digest(token: str) -> str:
    """What the store keeps of a token: its SHA-256 (tokens are random, so no salt is needed)."""
    return hashlib.sha256(token.encode()).hexdigest()


def session_csrf(cookie: str) -> str:
    """A session's CSRF token, made from its cookie by a one-way function: the server writes it
    into the session's pages (never into a cookie a script could read), and nobody without the
    cookie, which no script can read, can make it."""
    mac = hmac.new(cookie.encode(), b"klique csrf token", hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


class IdentityStore:
    """Klique's tokens and the browser sessions, over the task store's transactions."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # Tokens

    def add_token(
        self,
        user: str,
        *,
        kind: str = "user",
        scopes: Iterable[str] | None = None,
        team: str | None = None,
        groups: Iterable[str] = (),
        expires_at: float | None = None,
    ) -> tuple[str, TokenInfo]:
        """A new random token (256 bits) and what is kept of it; without `scopes`, those of
        its kind (KIND_SCOPES)."""
        scopes = KIND_SCOPES.get(kind, KIND_SCOPES["user"]) if scopes is None else scopes
        return _add_row(
            self.store,
            TokenRow,
            token_of,
            user=user,
            admin=kind == "admin",
            kind=kind,
            scopes=",".join(sorted(set(scopes))),
            team=team,
            groups=json.dumps(sorted(set(groups))),
            expires_at=expires_at,
        )

    def token(self, token: str) -> TokenInfo | None:
        """What is kept of `token` (revoked and expired ones too: the caller says which); its
        use is noted at most once a minute."""
        return _find_row(self.store, TokenRow, token, token_of)

    def tokens(self, user: str | None = None) -> list[TokenInfo]:
        query = select(TokenRow).order_by(TokenRow.created_at)
        if user is not None:
            query = query.where(TokenRow.user == user)
        with self.store.read() as session:
            return [token_of(row) for row in session.scalars(query)]

    def revoke(self, token_id: str, user: str | None = None) -> TokenInfo:
        """Revoke the token with this id (one of `user`'s when given)."""
        with self.store.write() as session:
            row = session.scalar(select(TokenRow).where(TokenRow.id == token_id))
            if row is None or (user is not None and row.user != user):
                raise NotFound(f"no token {token_id} of yours; `klique token ls` lists them")
            row.revoked = True
            return token_of(row)

    def token_by_id(self, token_id: str) -> TokenInfo | None:
        with self.store.read() as session:
            row = session.scalar(select(TokenRow).where(TokenRow.id == token_id))
            return token_of(row) if row is not None else None

    def is_service_user(self, name: str) -> bool:
        """Whether a service user has this name, in any case: a person's names are lower-cased
        (broker/identity/canonical.py), so "ci-bot" must not take a service user "CI-Bot"."""
        query = select(TokenRow.digest).where(
            func.lower(TokenRow.user) == name.lower(), TokenRow.kind == "service"
        )
        with self.store.read() as session:
            return session.scalar(query.limit(1)) is not None

    def has_admin(self) -> bool:
        """Whether any admin token was ever made (the first start makes one)."""
        with self.store.read() as session:
            return bool(session.scalar(select(func.count()).where(TokenRow.admin.is_(True))))

    # Browser sessions

    def add_session(
        self,
        user: str,
        groups: Iterable[str],
        refresh_token: str,
        fresh_until: float,
        expires_at: float,
        token_id: str | None = None,
    ) -> tuple[str, str]:
        """A new session: (the cookie's value, the CSRF token). The cookie is random and new;
        the CSRF token is `session_csrf` of it (the server can put it in the session's pages)."""
        cookie = secrets.token_urlsafe(32)
        csrf = session_csrf(cookie)
        with self.store.write() as session:
            session.add(
                SessionRow(
                    digest=token_digest(cookie),
                    user=user,
                    groups=json.dumps(sorted(set(groups))),
                    csrf_digest=token_digest(csrf),
                    refresh_token=refresh_token,
                    fresh_until=fresh_until,
                    expires_at=expires_at,
                    created_at=time.time(),
                    token_id=token_id,
                )
            )
        return cookie, csrf

    def session(self, cookie: str) -> SessionInfo | None:
        return self.session_by_digest(token_digest(cookie))

    def session_by_digest(self, digest: str) -> SessionInfo | None:
        with self.store.read() as session:
            row = session.get(SessionRow, digest)
            return session_of(row) if row is not None else None

    def refresh_session(
        self, digest: str, groups: Iterable[str], refresh_token: str, fresh_until: float
    ) -> None:
        with self.store.write() as session:
            row = session.get(SessionRow, digest)
            if row is not None:
                row.groups = json.dumps(sorted(set(groups)))
                row.refresh_token = refresh_token
                row.fresh_until = fresh_until

    def end_session(self, digest: str) -> None:
        with self.store.write() as session:
            session.execute(delete(SessionRow).where(SessionRow.digest == digest))
            # Sessions past their end go too, so that the table does not grow.
            session.execute(delete(SessionRow).where(SessionRow.expires_at < time.time()))


class AgentTokens:
    """The agents' tokens. Each names the pools it serves and ends: at its expiry, or at once
    when revoked; an id (`agent-` and the digest's start) names it in listings."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def add(self, pools: Sequence[str], expires_at: float) -> tuple[str, AgentTokenInfo]:
        """A new random token (256 bits) for these pools, and what is kept of it."""
        return _add_row(
            self.store,
            AgentTokenRow,
            agent_token_of,
            id_prefix=AGENT_ID_PREFIX,
            pools=json.dumps(sorted(set(pools))),
            expires_at=expires_at,
        )

    def find(self, token: str) -> AgentTokenInfo | None:
        """What is kept of `token`, revoked and expired ones too (the caller says which); its
        use is noted at most once a minute."""
        return _find_row(self.store, AgentTokenRow, token, agent_token_of)

    def all(self) -> list[AgentTokenInfo]:
        query = select(AgentTokenRow).order_by(AgentTokenRow.created_at)
        with self.store.read() as session:
            return [agent_token_of(row) for row in session.scalars(query)]

    def revoke(self, token_id: str) -> AgentTokenInfo:
        """Revoke the agent token with this id: its next call is refused."""
        with self.store.write() as session:
            row = session.scalar(select(AgentTokenRow).where(AgentTokenRow.id == token_id))
            if row is None:
                raise NotFound(f"no agent token {token_id}; `klique token ls` lists them")
            row.revoked = True
            return agent_token_of(row)


def _add_row(
    store: Store,
    table: type[TokenTable],
    kept: Callable[[TokenTable], Kept],
    id_prefix: str = "",
    **fields: Any,
) -> tuple[str, Kept]:
    """A new random token (256 bits), its row in `table` made with `fields`, and what is kept
    of it. Its id is `id_prefix` and the digest's start."""
    token = secrets.token_urlsafe(32)
    digest = token_digest(token)
    row = table(
        digest=digest,
        id=id_prefix + digest[:16],
        revoked=False,
        created_at=time.time(),
        **fields,
    )
    with store.write() as session:
        session.add(row)
        session.flush()
        return token, kept(row)


def _find_row(
    store: Store, table: type[TokenTable], token: str, kept: Callable[[TokenTable], Kept]
) -> Kept | None:
    """What is kept of `token` in `table`; its use is noted at most once a minute."""
    digest = token_digest(token)
    with store.read() as session:
        row = session.get(table, digest)
        if row is None:
            return None
        found, last_used_at = kept(row), row.last_used_at
    now = time.time()
    if last_used_at is None or now - last_used_at > TOKEN_TOUCH_EVERY_S:
        with store.write() as session:
            row = session.get(table, digest)
            if row is not None:
                row.last_used_at = now
    return found
