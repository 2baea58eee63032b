"""The estate's `identity:` section: the single sign-on provider, LDAP, the claims that name a
user and their groups, and which group makes which team. Pure: no I/O.

A leaf, below the domain: the domain's Estate carries the section, and broker/identity/ reads
it to sign people in."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from broker.units import Name, Seconds, Strict, parse_duration_s

# A claim's name, a group's name, a scope: printable, no spaces or control characters.
Word = Annotated[str, Field(pattern=r"^[^\s\x00-\x1f\x7f]{1,256}$")]


class OidcFile(Strict):
    """An OpenID Connect provider (the company's single sign-on)."""

    issuer: str = Field(pattern=r"^https://[^\s]+$", max_length=2048)
    """The provider's issuer URL, as its tokens name it in `iss` (HTTPS)."""
    client_id: Word
    """Klique's client id at the provider (the CLI's device flow and the web UI's login)."""
    client_secret_file: str | None = None
    """A confidential client's secret for the web UI's code exchange, in a file only the
    server's account reads; without it the client is public (PKCE alone)."""
    audience: Word | None = None
    """What access tokens must name in `aud` (unset: the client id)."""
    ca_file: str | None = None
    """A CA bundle for the provider's TLS (unset: the system's)."""
    scopes: list[Word] = ["openid", "profile", "groups", "offline_access"]
    """The scopes asked for at login."""
    public_url: str | None = Field(None, pattern=r"^https?://[^\s]+$")
    """How browsers reach this server (for the redirect URI and Secure cookies); unset: the
    URL a request came in on."""
    clock_leeway: Annotated[int, BeforeValidator(parse_duration_s), Field(ge=0, le=300)] = 30
    """Clock skew allowed between this server and the provider when checking exp, nbf, iat."""


class LdapFile(Strict):
    """A directory to check passwords against (simple bind), and to read groups from."""

    url: str = Field(pattern=r"^ldaps?://[^\s]+$")
    """The directory's URL, `ldaps://` or `ldap://` with `start_tls`."""
    start_tls: bool = False
    """Upgrade an `ldap://` connection with StartTLS before the bind."""
    ca_file: str | None = None
    """A CA bundle for the directory's TLS (unset: the system's)."""
    user_dn: str
    """A user's DN, with `{user}`: `uid={user},ou=people,dc=example,dc=com`."""
    group_base: str
    """Where groups live: `ou=groups,dc=example,dc=com`."""
    group_filter: str = "(member={dn})"
    """The search for a user's groups; `{dn}` is the user's DN, `{user}` the user name."""
    group_attribute: Word = "cn"
    """The attribute that names a group."""
    user_attribute: Word = "uid"
    """The attribute of the person's entry whose value is their Klique user name (read back
    from the entry after the bind, never taken from what was typed)."""
    case_sensitive: bool = False
    """Keep the user name's case; by default it is lower-cased, since uid compares
    case-insensitively in the standard schemas (RFC 4519)."""
    timeout: Seconds = 10
    """How long a bind or search may take."""


class ClaimsFile(Strict):
    """Which claims of the provider's tokens name the user and their groups."""

    username: Word = "preferred_username"
    """The claim holding the user name."""
    username_case_sensitive: bool = False
    """Keep the user name's case; by default it is lower-cased, since most providers compare
    user names ignoring case."""
    groups: Word = "groups"
    """The claim holding the user's groups."""


class IdentityFile(Strict):
    """Single sign-on, LDAP, and which groups make which teams."""

    oidc: OidcFile | None = None
    """The OpenID Connect provider (unset: no single sign-on)."""
    ldap: LdapFile | None = None
    """The LDAP directory (unset: no password logins)."""
    claims: ClaimsFile = ClaimsFile()
    """The claims that name a user and their groups."""
    groups: dict[Word, Name] = {}
    """Group to team, in order: a user in several groups gets the first that matches."""
    admin_groups: list[Word] = []
    """Groups whose members are Klique's administrators."""
    require_team: bool = True
    """Refuse a single sign-on or LDAP user who is in no team (no group maps to one)."""
    token_lifetime: Seconds = 12 * 3600
    """How long a token made by an LDAP login lasts."""
    session_lifetime: Seconds = 12 * 3600
    """How long a browser session lasts, at most."""


def identity_problems(
    identity: IdentityFile | None, teams: dict[str, Any]
) -> list[tuple[str, ...]]:
    """Cross-checks of the identity section: (field path..., message)."""
    if identity is None:
        return []
    problems: list[tuple[str, ...]] = []
    for group, team in identity.groups.items():
        if teams and team not in teams:
            problems.append(
                (
                    "identity",
                    "groups",
                    group,
                    f"team {team!r} is not declared; fix: add it under teams: (an empty list "
                    "of users is fine: its members come from the group)",
                )
            )
    ldap = identity.ldap
    if ldap is not None:
        if ldap.url.startswith("ldap://") and not ldap.start_tls:
            problems.append(
                (
                    "identity",
                    "ldap",
                    "url",
                    "passwords would cross the network in clear; fix: use ldaps:// or set "
                    "start_tls: true",
                )
            )
        if "{user}" not in ldap.user_dn:
            problems.append(
                (
                    "identity",
                    "ldap",
                    "user_dn",
                    "needs {user} where the user name goes; fix: write it like "
                    "uid={user},ou=people,dc=example,dc=com",
                )
            )
        if not re.search(r"\{(dn|user)\}", ldap.group_filter):
            problems.append(
                (
                    "identity",
                    "ldap",
                    "group_filter",
                    "needs {dn} or {user}; fix: write it like (member={dn}) or (memberUid={user})",
                )
            )
    return problems
