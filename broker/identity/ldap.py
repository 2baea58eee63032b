"""LDAP logins (ldap3, pure Python): a simple bind as the user over TLS (ldaps:// or
StartTLS, the server's certificate verified), then the user's groups, read with the same
connection. The person's Klique user name is read back from their entry (`user_attribute`),
never taken from what was typed. Values that enter a DN or a filter are escaped (RFC 4514,
RFC 4515)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from ldap3 import BASE, NONE, SUBTREE, Connection, Server, Tls
from ldap3.core.exceptions import LDAPException
from ldap3.utils.conv import escape_filter_chars
from ldap3.utils.dn import escape_rdn

from broker.identity.canonical import NotAName, user_name
from broker.identity_settings import LdapFile


class LdapRefused(Exception):
    """The directory refused the user name and password (the message says nothing more)."""


class LdapUnreachable(Exception):
    """The directory could not be asked (down, TLS failed): not the user's fault."""


class LdapUnusable(Exception):
    """The password is right but the entry names no single Klique user; the message says why
    and what the platform team can do."""


@dataclass(frozen=True)
class Person:
    user: str  # the Klique user name, from the entry's own attribute, normalised
    groups: list[str]


def login(settings: LdapFile, user: str, password: str) -> Person:
    """Who the directory says this is, once it accepts the password; LdapRefused otherwise.
    `user` is what was typed, normalised; the answer's name is the entry's."""
    if not password:
        # An empty password is an "unauthenticated bind" (RFC 4513 5.1.2), which many
        # directories accept as anonymous: it proves nothing.
        raise LdapRefused("wrong user name or password")
    dn = settings.user_dn.replace("{user}", escape_rdn(user))
    connection = Connection(
        _server(settings),
        user=dn,
        password=password,
        auto_bind=False,
        raise_exceptions=False,
        receive_timeout=settings.timeout,
        read_only=True,
    )
    try:
        _bind(connection, settings)
        entry_dn, named = _entry(connection, settings, dn)
        return Person(_klique_name(settings, named), _groups(connection, settings, entry_dn, named))
    finally:
        connection.unbind()


def _server(settings: LdapFile) -> Server:
    tls = Tls(
        validate=ssl.CERT_REQUIRED,
        version=ssl.PROTOCOL_TLS_CLIENT,
        ca_certs_file=settings.ca_file,
    )
    return Server(
        settings.url,
        use_ssl=settings.url.startswith("ldaps://"),
        tls=tls,
        get_info=NONE,
        connect_timeout=settings.timeout,
    )


def _bind(connection: Connection, settings: LdapFile) -> None:
    try:
        connection.open()
        if settings.start_tls and not connection.start_tls():
            raise LdapUnreachable(f"StartTLS failed at {settings.url}: {connection.result}")
        bound = connection.bind()
    except LDAPException as exc:
        raise LdapUnreachable(f"cannot reach the directory at {settings.url}: {exc}") from exc
    if not bound:
        raise LdapRefused("wrong user name or password")


def _entry(connection: Connection, settings: LdapFile, dn: str) -> tuple[str, list[str]]:
    """The bound entry's DN and its `user_attribute` values, as the directory keeps them."""
    attribute = settings.user_attribute
    try:
        connection.search(dn, "(objectClass=*)", BASE, attributes=[attribute])
    except LDAPException as exc:
        raise LdapUnreachable(f"cannot read the entry {dn}: {exc}") from exc
    for entry in connection.response or []:
        if entry.get("type") == "searchResEntry":
            values = (entry.get("attributes") or {}).get(attribute) or []
            named = [values] if isinstance(values, str) else [str(v) for v in values]
            return str(entry.get("dn") or dn), named
    raise LdapUnusable(
        f"the directory accepted the password but shows no entry at {dn}; ask the platform "
        "team to let a person read their own entry"
    )


def _klique_name(settings: LdapFile, named: list[str]) -> str:
    """The one Klique user name the entry's `user_attribute` gives."""
    attribute = settings.user_attribute
    try:
        names = {user_name(v, settings.case_sensitive, f"the entry's {attribute}") for v in named}
    except NotAName as exc:
        raise LdapUnusable(f"{exc}; ask the platform team to check the directory entry") from None
    if len(names) != 1:
        raise LdapUnusable(
            f"the directory entry has {len(names) or 'no'} {attribute} values where Klique "
            f"needs one; ask the platform team to check identity.ldap.user_attribute"
        )
    return names.pop()


def _groups(connection: Connection, settings: LdapFile, dn: str, named: list[str]) -> list[str]:
    query = settings.group_filter.replace("{dn}", escape_filter_chars(dn)).replace(
        "{user}", escape_filter_chars(named[0])
    )
    try:
        connection.search(
            settings.group_base, query, SUBTREE, attributes=[settings.group_attribute]
        )
    except LDAPException as exc:
        raise LdapUnreachable(f"cannot read groups under {settings.group_base}: {exc}") from exc
    names: list[str] = []
    for entry in connection.response or []:
        values = (entry.get("attributes") or {}).get(settings.group_attribute) or []
        names += [values] if isinstance(values, str) else [str(v) for v in values]
    return names
