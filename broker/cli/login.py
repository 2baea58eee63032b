"""`klique login`: a token, the single sign-on's device flow (--sso) or an LDAP password
(--ldap USER), kept for the profile's server after the server has accepted it."""

from __future__ import annotations

from typing import Any

import click

from broker import config
from broker.client import ApiError, Client, save_token
from broker.identity import device


@click.command()
@click.option("--token", help="The token (default: ask for it).")
@click.option("--sso", is_flag=True, help="Log in through the company's single sign-on.")
@click.option("--ldap", "ldap_user", metavar="USER", help="Log in with USER's LDAP password.")
@click.option(
    "--api",
    help="The server's URL, kept as the profile's server (default: the profile's, else "
    "$KLIQUE_API, else the local server).",
)
def login(token: str | None, sso: bool, ldap_user: str | None, api: str | None) -> None:
    """Store a token for the server, after checking that the server accepts it.

    With --sso, open the address it prints and confirm the code: the refresh token is kept
    (mode 600) and access tokens are renewed silently. With --ldap, a token that lasts the
    server's identity.token_lifetime is kept."""
    if sso or ldap_user:
        client = Client(api=api, anonymous=True)
        entry: str | dict[str, Any] = (
            sso_login(client) if sso else ldap_login(client, str(ldap_user))
        )
    else:
        entry = token or click.prompt("token", hide_input=True)
    # A sign-on's access token may end before it is checked (a short lifetime, a slow
    # machine): the check renews it with the refresh token, and the renewed one is kept.
    client = Client(api=api, token=entry) if isinstance(entry, str) else Client(api=api, sso=entry)
    me = client.get("/whoami")
    path = save_token(client.api, client.sso or entry, config.profile())
    team = f", team {me['team']}" if me.get("team") else ""
    click.echo(
        f"logged in to {client.api} as {me['user']}{team} "
        f"(profile {config.profile()}, kept in {path})"
    )


def sso_login(client: Client) -> dict[str, Any]:
    """The device flow against the provider the server names; the credential entry to keep."""
    oidc = client.get("/auth/config").get("oidc")
    if not oidc:
        raise ApiError(f"the server at {client.api} has no single sign-on; use --token or --ldap")
    return device.device_login(oidc, lambda line: click.echo(line, err=True))


def ldap_login(client: Client, user: str) -> str:
    """A token for USER's LDAP password, asked for here and checked by the server."""
    if not client.get("/auth/config").get("ldap"):
        raise ApiError(f"the server at {client.api} has no LDAP login; use --token or --sso")
    password = click.prompt(f"LDAP password for {user}", hide_input=True)
    return str(client.post("/auth/ldap", {"user": user, "password": password})["token"])
