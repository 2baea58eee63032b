"""`klique login --sso` (the device flow) and `klique login --ldap USER` (a password)."""

from __future__ import annotations

from typing import Any

import click

from broker.client import ApiError, Client


def sso_login(client: Client) -> dict[str, Any]:
    from broker.identity.device import device_login

    oidc = client.get("/auth/config").get("oidc")
    if not oidc:
        raise ApiError(f"the server at {client.api} has no single sign-on; use --token or --ldap")
    return device_login(oidc, lambda line: click.echo(line, err=True))


def ldap_login(client: Client, user: str) -> str:
    if not client.get("/auth/config").get("ldap"):
        raise ApiError(f"the server at {client.api} has no LDAP login; use --token or --sso")
    password = click.prompt(f"LDAP password for {user}", hide_input=True)
    return str(client.post("/auth/ldap", {"user": user, "password": password})["token"])
