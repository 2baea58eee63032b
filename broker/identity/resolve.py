"""Who is calling: a Klique token, a single sign-on access token, or a browser session, each
turned into one `Caller` (user, team, admin, scopes), under the same rules whichever path."""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from broker.domain import Estate
from broker.identity.authlib_httpx import OAuthError
from broker.identity.canonical import NotAName, user_name
from broker.identity.oidc import InvalidToken, Provider, ProviderUnreachable
from broker.identity.teams import is_admin, team_for
from broker.identity_settings import IdentityFile
from broker.store.identity import IdentityStore, token_digest
from broker.store.repository import Store
from broker.store.rows import SessionInfo, TokenInfo

USER_SCOPES = frozenset({"read", "submit"})
ADMIN_SCOPES = frozenset({"admin", "read", "submit"})
# A session asks the provider again (refresh: is the user still there, in which groups?)
# this often at most, or when the provider's access token expires, whichever is sooner.
SESSION_RECHECK_S = 300.0
# A Klique token read from the store is trusted this long before it is read again, so that a
# burst of requests reads it once; a revocation through this server forgets them all at once.
TOKEN_MEMORY_S = 5.0
TOKEN_MEMORY_SIZE = 10_000


@dataclass(frozen=True)
class Caller:
    user: str
    admin: bool
    team: str | None = None
    kind: str = "user"  # user, service, admin
    scopes: frozenset[str] = field(default=USER_SCOPES)
    via: str = "token"  # token, sso (a bearer access token), session (a browser), ldap


class Refused(Exception):
    """Not let in: 401 (who are you?) or 403 (known, not allowed); the message says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


LOGIN_HINT = "run `klique login --token TOKEN` (the server prints where its admin token is)"
SSO_HINT = "run `klique login --sso` again"


class Identities:
    def __init__(self, store: Store, estate: Callable[[], Estate]) -> None:
        self.store = IdentityStore(store)
        self.estate = estate
        self._provider: Provider | None = None
        self._lock = threading.Lock()
        # digest -> (monotonic time read, what the store keeps); `_revocations` counts the
        # revocations, so that a read that began before one is not remembered after it.
        self._tokens: dict[str, tuple[float, TokenInfo]] = {}
        self._revocations = 0

    @property
    def identity(self) -> IdentityFile | None:
        return self.estate().identity

    def provider(self) -> Provider | None:
        settings = self.identity.oidc if self.identity else None
        if settings is None:
            return None
        with self._lock:
            if self._provider is None or self._provider.settings != settings:
                self._provider = Provider(settings)
            return self._provider

    # Klique's own tokens

    def from_token(self, token: str) -> Caller:
        found = self._token(token)
        if found is None:
            raise Refused(401, f"missing or unknown token; {LOGIN_HINT}")
        if found.revoked:
            raise Refused(401, f"token {found.id} was revoked; ask the platform team for a new one")
        if found.expired(time.time()):
            raise Refused(401, f"token {found.id} has expired; ask the platform team for a new one")
        return self._token_caller(found)

    def remembered(self, token: str) -> Caller | None:
        """The caller of a token in force that was read from the store in the last few seconds,
        or None (ask `from_token`). Reads nothing: the event loop may call it."""
        entry = self._tokens.get(token_digest(token)) if token else None
        if entry is None or time.monotonic() - entry[0] > TOKEN_MEMORY_S:
            return None
        found = entry[1]
        if found.revoked or found.expired(time.time()):
            return None
        return self._token_caller(found)

    def revoke(self, token_id: str, user: str | None = None) -> TokenInfo:
        """Revoke a token (one of `user`'s when given): refused from the next request on."""
        revoked = self.store.revoke(token_id, user)
        with self._lock:
            self._revocations += 1
            self._tokens.clear()
        return revoked

    def _token(self, token: str) -> TokenInfo | None:
        with self._lock:
            revocations = self._revocations
        found = self.store.token(token)
        if found is not None:
            with self._lock:
                if revocations == self._revocations:  # no revocation ended during the read
                    if len(self._tokens) >= TOKEN_MEMORY_SIZE:
                        self._tokens.clear()
                    self._tokens[token_digest(token)] = (time.monotonic(), found)
        return found

    def _token_caller(self, found: TokenInfo) -> Caller:
        estate = self.estate()
        team = found.team if found.kind == "service" else team_for(estate, found.user, found.groups)
        scopes = ADMIN_SCOPES if found.admin else found.scopes
        return Caller(found.user, found.admin, team, found.kind, frozenset(scopes), "token")

    # Single sign-on

    def from_access_token(self, token: str) -> Caller:
        provider = self.provider()
        if provider is None:
            raise Refused(401, f"this server has no single sign-on: {LOGIN_HINT}")
        try:
            claims = provider.verify(token)
        except InvalidToken as exc:
            raise Refused(401, f"the single sign-on token was refused: {exc}; {SSO_HINT}") from None
        except ProviderUnreachable as exc:
            raise Refused(401, f"cannot check the single sign-on token now: {exc}") from None
        return self.from_claims(claims, "sso")

    def from_claims(self, claims: dict[str, Any], via: str) -> Caller:
        user, groups = self.user_and_groups(claims)
        return self.person(user, groups, via)

    def user_and_groups(self, claims: dict[str, Any]) -> tuple[str, list[str]]:
        identity = self.identity
        assert identity is not None
        named = claims.get(identity.claims.username)
        try:
            # Normalised as the provider compares names: "Alice" is alice, not a second user.
            user = user_name(
                named if isinstance(named, str) else "",
                identity.claims.username_case_sensitive,
                f"the provider's {identity.claims.username!r} claim",
            )
        except NotAName as exc:
            raise Refused(
                403, f"{exc}; ask the platform team to check identity.claims in the estate"
            ) from None
        raw = claims.get(identity.claims.groups) or []
        groups = [raw] if isinstance(raw, str) else [g for g in raw if isinstance(g, str)]
        return user, groups

    def person(self, user: str, groups: list[str] | tuple[str, ...], via: str) -> Caller:
        """A person who logged in through the directory (single sign-on or LDAP)."""
        estate = self.estate()
        if self.store.is_service_user(user):
            raise Refused(403, f"{user!r} is a service user's name; a person cannot log in as it")
        team = team_for(estate, user, groups)
        if team is None and self.identity is not None and self.identity.require_team:
            raise Refused(
                403,
                f"user {user!r} is in none of the groups that make a team (identity.groups in "
                "the estate); ask the platform team to add you to one",
            )
        admin = is_admin(estate, groups)
        return Caller(user, admin, team, "user", ADMIN_SCOPES if admin else USER_SCOPES, via)

    # Browser sessions

    def from_session(self, cookie: str, unsafe: bool, csrf: str | None) -> Caller:
        found = self.store.session(cookie)
        if found is None or time.time() >= found.expires_at:
            if found is not None:
                self.store.end_session(found.digest)
            raise Refused(401, "no session, or it has ended; log in again at /auth/login")
        if unsafe and not _csrf_matches(found, csrf):
            raise Refused(
                403,
                "a request that changes something needs the X-Klique-CSRF header with the "
                "session's CSRF token (in the web UI's pages); see docs/identity.md",
            )
        if found.token_id is not None:
            return self._token_session(found)
        groups = found.groups
        if time.time() >= found.fresh_until:
            groups = tuple(self._recheck(found))
        return self.person(found.user, groups, "session")

    def _token_session(self, found: SessionInfo) -> Caller:
        """A session signed in with a Klique token is that token, while it is in force."""
        token = self.store.token_by_id(str(found.token_id))
        if token is None or token.revoked or token.expired(time.time()):
            self.store.end_session(found.digest)
            raise Refused(401, "the token this session signed in with has ended; sign in again")
        return replace(self._token_caller(token), via="session")

    def _recheck(self, found: SessionInfo) -> list[str]:
        """Ask the provider again (refresh): a user it dropped loses the session here."""
        provider = self.provider()
        try:
            if provider is None:
                raise InvalidToken("single sign-on is no longer configured")
            tokens = provider.refresh(found.refresh_token)
            claims = provider.verify(str(tokens.get("access_token", "")))
            user, groups = self.user_and_groups(claims)
            if user != found.user:
                raise InvalidToken("the provider now names another user")
        except (InvalidToken, ProviderUnreachable, Refused, OAuthError, httpx.HTTPError) as exc:
            self.store.end_session(found.digest)
            raise Refused(
                401, f"your single sign-on session has ended ({exc}); log in again at /auth/login"
            ) from None
        self.store.refresh_session(
            found.digest,
            groups,
            str(tokens.get("refresh_token") or found.refresh_token),
            session_fresh_until(tokens),
        )
        return groups


def session_fresh_until(tokens: dict[str, Any]) -> float:
    expires_in = tokens.get("expires_in")
    lifetime = float(expires_in) if isinstance(expires_in, int | float) else SESSION_RECHECK_S
    return time.time() + min(lifetime, SESSION_RECHECK_S)


def _csrf_matches(found: SessionInfo, csrf: str | None) -> bool:
    given = token_digest(csrf or "")
    return bool(csrf) and hmac.compare_digest(given, found.csrf_digest)
