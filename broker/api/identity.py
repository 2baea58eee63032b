"""Identity routes: Klique tokens (users, service users; scoped, expiring, revocable), the
login methods a server offers, LDAP logins, and the browser's single sign-on
(`/auth/login`, `/auth/callback`, `/auth/logout`; see docs/identity.md for the cookie and CSRF
contract)."""

import time
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Request
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field

from broker.api.identity_web import browser_routes
from broker.errors import NotPermitted
from broker.http.callers import Auth
from broker.identity import ldap
from broker.identity.canonical import NotAName, user_name
from broker.identity.resolve import Identities, Refused
from broker.identity.throttle import Throttle, retry_after
from broker.names import LINE, NAME
from broker.store.rows import TokenInfo

Scope = Literal["read", "submit"]
TokenId = Annotated[str, PathParam(pattern=r"^[0-9a-f]{16}$", description="A token's id.")]
# LDAP logins that fail: at most this many per user name (all its spellings) and this many
# from one source address (one password tried over many names) in a minute, then 429. Each
# count is kept for at most this many names or addresses (the least recently failed go).
_LDAP_FAILURES = 5
_LDAP_ADDRESS_FAILURES = 20
_LDAP_WINDOW_S = 60.0
_LDAP_TABLE_SIZE = 10_000


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TokenRequest(_Body):
    """A token for `user`; with `service`, for a service user of `team` (CI, a bot)."""

    user: str = Field(pattern=NAME)
    admin: bool = False
    service: bool = False
    team: str | None = Field(None, pattern=NAME)
    scopes: list[Scope] = Field(["read", "submit"], min_length=1, max_length=2)
    expires_in: int | None = Field(None, ge=1, le=10 * 366 * 86400, description="Seconds.")


class TokenOut(BaseModel):
    id: str
    user: str
    kind: str
    team: str | None
    scopes: list[str]
    expires_at: float | None
    revoked: bool
    last_used_at: float | None
    created_at: float

    @classmethod
    def of(cls, info: TokenInfo) -> "TokenOut":
        return cls(
            id=info.id,
            user=info.user,
            kind=info.kind,
            team=info.team,
            scopes=sorted(info.scopes),
            expires_at=info.expires_at,
            revoked=info.revoked,
            last_used_at=info.last_used_at,
            created_at=info.created_at,
        )


class TokenMade(TokenOut):
    token: str  # shown once; the server keeps only its digest


class LdapLogin(_Body):
    # As typed ("ALICE", " alice"): normalised to the name the directory compares
    # (broker/identity/canonical.py) before anything else, then it must be a Klique name.
    user: str = Field(min_length=1, max_length=256, pattern=LINE)
    password: str = Field(min_length=1, max_length=1024, pattern=r"^[^\x00]*$")


class OidcConfigOut(BaseModel):
    issuer: str
    client_id: str
    scopes: list[str]


class AuthConfigOut(BaseModel):
    """How to log in to this server (no token needed to ask)."""

    oidc: OidcConfigOut | None
    ldap: bool
    login_url: str | None  # the browser's single sign-on


def identity_router(identities: Identities, api: str) -> APIRouter:
    router = APIRouter()
    failures = _Failures()

    @router.get(f"{api}/auth/config")
    def auth_config() -> AuthConfigOut:
        identity = identities.identity
        oidc = identity.oidc if identity else None
        return AuthConfigOut(
            oidc=OidcConfigOut(issuer=oidc.issuer, client_id=oidc.client_id, scopes=oidc.scopes)
            if oidc
            else None,
            ldap=bool(identity and identity.ldap),
            login_url="/auth/login" if oidc else None,
        )

    @router.post(f"{api}/auth/ldap", status_code=201, responses={429: {"description": "slow"}})
    def ldap_login(body: LdapLogin, request: Request) -> TokenMade:
        """A password checked against the site's LDAP directory; answers a Klique token for
        the user the directory's entry names, that expires after identity.token_lifetime."""
        identity = identities.identity
        if identity is None or identity.ldap is None:
            raise HTTPException(404, "this server has no LDAP login; ask the platform team")
        try:
            typed = user_name(body.user, identity.ldap.case_sensitive)
        except NotAName as exc:
            raise HTTPException(422, str(exc)) from None
        address = request.client.host if request.client else "unknown"
        # Counted as a failure before the directory is asked (a throttled try never reaches
        # it, and tries sent at once cannot all pass), and forgiven unless it fails.
        failures.take(typed, address)
        try:
            person = ldap.login(identity.ldap, typed, body.password)
        except ldap.LdapRefused as exc:
            raise HTTPException(401, str(exc)) from None
        except ldap.LdapUnreachable as exc:
            failures.forgive(typed, address)
            raise HTTPException(503, str(exc)) from None
        except ldap.LdapUnusable as exc:
            failures.forgive(typed, address)
            raise HTTPException(403, str(exc)) from None
        failures.forgive(typed, address)
        try:
            who = identities.person(person.user, person.groups, "ldap")
        except Refused as exc:
            raise HTTPException(exc.status, str(exc)) from None
        token, info = identities.store.add_token(
            who.user,
            groups=person.groups,
            expires_at=time.time() + identity.token_lifetime,
        )
        return TokenMade(**TokenOut.of(info).model_dump(), token=token)

    @router.post(f"{api}/tokens", status_code=201)
    def create_token(body: TokenRequest, who: Auth) -> TokenMade:
        if not who.admin:
            raise NotPermitted("only an admin token can make tokens")
        kind = "admin" if body.admin else "service" if body.service else "user"
        _check_token_request(identities, body, kind)
        scopes = ("admin", "read", "submit") if body.admin else tuple(body.scopes)
        token, info = identities.store.add_token(
            body.user,
            kind=kind,
            scopes=scopes,
            team=body.team if body.service else None,
            expires_at=time.time() + body.expires_in if body.expires_in else None,
        )
        return TokenMade(**TokenOut.of(info).model_dump(), token=token)

    @router.get(f"{api}/tokens")
    def list_tokens(who: Auth) -> list[TokenOut]:
        """Every token (admin), or the caller's own; never the tokens themselves."""
        found = identities.store.tokens(None if who.admin else who.user)
        return [TokenOut.of(t) for t in found]

    @router.post(f"{api}/tokens/{{token_id}}/revoke")
    def revoke_token(token_id: TokenId, who: Auth) -> TokenOut:
        return TokenOut.of(identities.revoke(token_id, None if who.admin else who.user))

    router.include_router(browser_routes(identities))
    return router


def _check_token_request(identities: Identities, body: TokenRequest, kind: str) -> None:
    estate = identities.estate()
    if kind == "service":
        known = set(estate.teams) | set(estate.policies)
        if estate.identity is not None:
            known |= set(estate.identity.groups.values())
        if body.team is None or (known and body.team not in known):
            raise HTTPException(
                400,
                f"a service user needs --team, one of the estate's teams "
                f"({', '.join(sorted(known)) or 'none declared'})",
            )
        if estate.team_of(body.user) is not None:
            raise HTTPException(
                400, f"{body.user!r} is a person in the estate's teams; name the service apart"
            )
    elif body.team is not None:
        raise HTTPException(400, "--team is for service users; a person's team is the estate's")


class _Failures:
    """Failed LDAP logins in the last minute, per user name and per source address (a brake
    on password guessing), each in a table of bounded size."""

    def __init__(self) -> None:
        self.by_name = Throttle(_LDAP_FAILURES, _LDAP_WINDOW_S, _LDAP_TABLE_SIZE)
        self.by_address = Throttle(_LDAP_ADDRESS_FAILURES, _LDAP_WINDOW_S, _LDAP_TABLE_SIZE)

    def take(self, name: str, address: str) -> None:
        """Count this try against the name and the address; 429, with Retry-After, counting
        nothing, when either has failed too often."""
        wait = self.by_name.take(name)
        if wait:
            raise HTTPException(
                429,
                "too many failed logins for this user; wait a minute",
                headers={"Retry-After": retry_after(wait)},
            )
        wait = self.by_address.take(address)
        if wait:
            self.by_name.forgive(name)
            raise HTTPException(
                429,
                "too many failed logins from this address; wait a minute",
                headers={"Retry-After": retry_after(wait)},
            )

    def forgive(self, name: str, address: str) -> None:
        """This try did not fail (the password was right, or the directory was not asked)."""
        self.by_name.forgive(name)
        self.by_address.forgive(address)
