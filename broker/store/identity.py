"""The store's identity half: Klique's tokens (users, service users, admins) and browser
sessions. Secrets are kept as SHA-256 digests; the caller compares nothing itself."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import delete, func, select

from broker.errors import NotFound
from broker.store.repository import Store, add_token_row, find_token_row, token_digest
from broker.store.tables import SessionRow, TokenRow


@dataclass(frozen=True)
class TokenInfo:
    id: str
    user: str
    admin: bool
    kind: str  # user, service, admin
    scopes: frozenset[str]  # read, submit, admin
    team: str | None
    groups: tuple[str, ...]
    expires_at: float | None
    revoked: bool
    last_used_at: float | None
    created_at: float

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


@dataclass(frozen=True)
class SessionInfo:
    digest: str
    user: str
    groups: tuple[str, ...]
    csrf_digest: str
    refresh_token: str
    fresh_until: float
    expires_at: float
    token_id: str | None = None  # a session signed in with a Klique token stands for it


class IdentityStore:
    def __init__(self, store: Store) -> None:
        self.store = store

    # Tokens

    def add_token(
        self,
        user: str,
        *,
        kind: str = "user",
        scopes: Iterable[str] = ("read", "submit"),
        team: str | None = None,
        groups: Iterable[str] = (),
        expires_at: float | None = None,
    ) -> tuple[str, TokenInfo]:
        """A new random token (256 bits) and what is kept of it."""
        return add_token_row(
            self.store,
            TokenRow,
            _token,
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
        return find_token_row(self.store, TokenRow, token, _token)

    def tokens(self, user: str | None = None) -> list[TokenInfo]:
        query = select(TokenRow).order_by(TokenRow.created_at)
        if user is not None:
            query = query.where(TokenRow.user == user)
        with self.store._sessions() as session:
            return [_token(row) for row in session.scalars(query)]

    def revoke(self, token_id: str, user: str | None = None) -> TokenInfo:
        """Revoke the token with this id (one of `user`'s when given)."""
        with self.store._tx() as session:
            row = session.scalar(select(TokenRow).where(TokenRow.id == token_id))
            if row is None or (user is not None and row.user != user):
                raise NotFound(f"no token {token_id} of yours; `klique token ls` lists them")
            row.revoked = True
            return _token(row)

    def token_by_id(self, token_id: str) -> TokenInfo | None:
        with self.store._sessions() as session:
            row = session.scalar(select(TokenRow).where(TokenRow.id == token_id))
            return _token(row) if row is not None else None

    def is_service_user(self, name: str) -> bool:
        """Whether a service user has this name, in any case: a person's names are lower-cased
        (broker/identity/canonical.py), so "ci-bot" must not take a service user "CI-Bot"."""
        query = select(TokenRow.digest).where(
            func.lower(TokenRow.user) == name.lower(), TokenRow.kind == "service"
        )
        with self.store._sessions() as session:
            return session.scalar(query.limit(1)) is not None

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
        with self.store._tx() as session:
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
        with self.store._sessions() as session:
            row = session.get(SessionRow, digest)
            return _session(row) if row is not None else None

    def refresh_session(
        self, digest: str, groups: Iterable[str], refresh_token: str, fresh_until: float
    ) -> None:
        with self.store._tx() as session:
            row = session.get(SessionRow, digest)
            if row is not None:
                row.groups = json.dumps(sorted(set(groups)))
                row.refresh_token = refresh_token
                row.fresh_until = fresh_until

    def end_session(self, digest: str) -> None:
        with self.store._tx() as session:
            session.execute(delete(SessionRow).where(SessionRow.digest == digest))
            # Sessions past their end go too, so that the table does not grow.
            session.execute(delete(SessionRow).where(SessionRow.expires_at < time.time()))


def _token(row: TokenRow) -> TokenInfo:
    return TokenInfo(
        id=row.id,
        user=row.user,
        admin=row.admin,
        kind=row.kind,
        scopes=frozenset(s for s in row.scopes.split(",") if s),
        team=row.team,
        groups=tuple(json.loads(row.groups or "[]")),
        expires_at=row.expires_at,
        revoked=row.revoked,
        last_used_at=row.last_used_at,
        created_at=row.created_at,
    )


def _session(row: SessionRow) -> SessionInfo:
    return SessionInfo(
        digest=row.digest,
        user=row.user,
        groups=tuple(json.loads(row.groups or "[]")),
        csrf_digest=row.csrf_digest,
        refresh_token=row.refresh_token,
        fresh_until=row.fresh_until,
        expires_at=row.expires_at,
        token_id=row.token_id,
    )


def session_csrf(cookie: str) -> str:
    """A session's CSRF token, made from its cookie by a one-way function: the server writes it
    into the session's pages (never into a cookie a script could read), and nobody without the
    cookie, which no script can read, can make it."""
    mac = hmac.new(cookie.encode(), b"klique csrf token", hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")
