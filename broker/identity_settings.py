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
    client_id: Word
    # A confidential client's secret for the web UI's code exchange, in a file only the
    # server's account reads; without it the client is public (PKCE alone).
    client_secret_file: str | None = None
    audience: Word | None = None  # what access tokens must name in `aud` (default: client_id)
    ca_file: str | None = None  # a CA bundle for the provider's TLS (default: the system's)
    scopes: list[Word] = ["openid", "profile", "groups", "offline_access"]
    # How browsers reach this server (for the redirect URI and Secure cookies); default: the
    # URL a request came in on.
    public_url: str | None = Field(None, pattern=r"^https?://[^\s]+$")
    # Clock skew allowed between this server and the provider when checking exp, nbf, iat.
    clock_leeway: Annotated[int, BeforeValidator(parse_duration_s), Field(ge=0, le=300)] = 30


class LdapFile(Strict):
    """A directory to check passwords against (simple bind), and to read groups from."""

    url: str = Field(pattern=r"^ldaps?://[^\s]+$")
    start_tls: bool = False
    ca_file: str | None = None
    user_dn: str  # with {user}: uid={user},ou=people,dc=example,dc=com
    group_base: str  # where groups live: ou=groups,dc=example,dc=com
    group_filter: str = "(member={dn})"  # {dn}: the user's DN; {user}: the user name
    group_attribute: Word = "cn"  # the attribute that names a group
    # The attribute of the person's entry whose value is their Klique user name (read back
    # from the entry after the bind, never taken from what was typed).
    user_attribute: Word = "uid"
    # uid compares case-insensitively in the standard schemas (RFC 4519), so the name is
    # lower-cased; true keeps its case (an attribute whose matching rule is case-exact).
    case_sensitive: bool = False
    timeout: Seconds = 10


class ClaimsFile(Strict):
    username: Word = "preferred_username"
    # The provider compares user names ignoring case (most do), so the name is lower-cased;
    # true keeps its case.
    username_case_sensitive: bool = False
    groups: Word = "groups"


class IdentityFile(Strict):
    oidc: OidcFile | None = None
    ldap: LdapFile | None = None
    claims: ClaimsFile = ClaimsFile()
    # Group -> team, in order: a user in several groups gets the first that matches.
    groups: dict[Word, Name] = {}
    admin_groups: list[Word] = []
    # Refuse a single sign-on or LDAP user who is in no team (no group maps to one).
    require_team: bool = True
    token_lifetime: Seconds = 12 * 3600  # tokens made by an LDAP login
    session_lifetime: Seconds = 12 * 3600  # browser sessions, at most


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
