"""LDAP logins (ldap3, pure Python): a simple bind as the user over TLS (ldaps:// or
StartTLS, the server's certificate verified), then the user's groups, read with the same
connection. Values that enter a DN or a filter are escaped (RFC 4514, RFC 4515)."""

from __future__ import annotations

import ssl

from ldap3 import NONE, SUBTREE, Connection, Server, Tls
from ldap3.core.exceptions import LDAPException
from ldap3.utils.conv import escape_filter_chars
from ldap3.utils.dn import escape_rdn

from broker.identity.config import LdapFile


class LdapRefused(Exception):
    """The directory refused the user name and password (the message says nothing more)."""


class LdapUnreachable(Exception):
    """The directory could not be asked (down, TLS failed): not the user's fault."""


def login(settings: LdapFile, user: str, password: str) -> list[str]:
    """The user's groups, once the directory accepts their password; LdapRefused otherwise."""
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
        return _groups(connection, settings, dn, user)
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


def _groups(connection: Connection, settings: LdapFile, dn: str, user: str) -> list[str]:
    query = settings.group_filter.replace("{dn}", escape_filter_chars(dn)).replace(
        "{user}", escape_filter_chars(user)
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
