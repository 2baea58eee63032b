"""`klique token ...`: tokens for users, service users (CI, bots) and pool agents."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from broker.cli.output import json_option, table, when
from broker.client import Client
from broker.names import AGENT_ID_PREFIX
from broker.quantities import parse_duration_s


@click.group()
def token() -> None:
    """Tokens for users, service users (CI, bots) and pool agents: make, list, revoke."""


@token.command("create")
@click.argument("user", required=False)
@click.option("--service", metavar="NAME", help="A service user (CI, a bot) of --team.")
@click.option("--team", help="The service user's team: its runs count there.")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    type=click.Choice(["submit", "read"]),
    help="What the token may do (repeatable; default both). read: look only; submit: submit "
    "and cancel.",
)
@click.option("--expires", metavar="DURATION", help="Expire after 30d, 12h, ... (default: never).")
@click.option("--admin", is_flag=True, help="Make an admin token.")
@json_option
def token_create(
    user: str | None,
    service: str | None,
    team: str | None,
    scopes: tuple[str, ...],
    expires: str | None,
    admin: bool,
    as_json: bool,
) -> None:
    """Print a new token for USER, or for the service user --service NAME (admin only)."""
    if bool(user) == bool(service):
        raise click.UsageError("give either USER or --service NAME")
    body: dict[str, Any] = {"user": user or service, "admin": admin, "service": bool(service)}
    if team:
        body["team"] = team
    if scopes:
        body["scopes"] = sorted(set(scopes))
    if expires:
        try:
            body["expires_in"] = parse_duration_s(expires)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--expires") from None
    made = Client().post("/tokens", body)
    click.echo(json.dumps(made, indent=2) if as_json else made["token"])


@token.command("ls")
@json_option
def token_ls(as_json: bool) -> None:
    """List tokens: everyone's and the pool agents' with an admin token, else your own (never
    the tokens)."""
    client = Client()
    rows = client.get("/tokens")
    if client.get("/whoami")["admin"]:
        rows += client.get("/agent-tokens")
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    now = time.time()
    for row in rows:
        row["expires"] = when(row["expires_at"]) if row["expires_at"] else "never"
        row["last_used"] = when(row["last_used_at"]) if row["last_used_at"] else "never"
        row["state"] = _token_state(row, now)
    table(
        rows,
        [
            ("id", "ID"),
            ("kind", "KIND"),
            ("user", "USER"),
            ("team", "TEAM"),
            ("scopes", "SCOPES"),
            ("pools", "POOLS"),
            ("expires", "EXPIRES"),
            ("last_used", "LAST USED"),
            ("state", "STATE"),
        ],
    )


def _token_state(row: dict[str, Any], now: float) -> str:
    """Whether a token is still good, in the words `klique token ls` prints."""
    if row["revoked"]:
        return "revoked"
    return "expired" if row["expires_at"] and row["expires_at"] <= now else "in force"


@token.command("revoke")
@click.argument("token_ids", nargs=-1, required=True)
def token_revoke(token_ids: tuple[str, ...]) -> None:
    """Revoke tokens by id (`klique token ls` shows them): yours, or any with an admin token;
    an agent token (agent-...) with an admin token. A revoked token is refused at its next
    use."""
    client = Client()
    for token_id in token_ids:
        if token_id.startswith(AGENT_ID_PREFIX):
            done = client.post(f"/agent-tokens/{token_id}/revoke")
            click.echo(f"agent token {done['id']} of pools {', '.join(done['pools'])} revoked")
            continue
        done = client.post(f"/tokens/{token_id}/revoke")
        click.echo(f"token {done['id']} of {done['user']} revoked")


@token.command("create-agent")
@click.option("--pool", "pools", multiple=True, required=True, help="A pool it serves.")
@click.option(
    "--expires",
    metavar="DURATION",
    default="90d",
    show_default=True,
    help="Expire after 30d, 12h, ... (at most 366d).",
)
@json_option
def token_create_agent(pools: tuple[str, ...], expires: str, as_json: bool) -> None:
    """Print a new token for `klique agent`: it may act only for these pools (declared
    `agent: remote`) until it expires or is revoked (`klique token ls` shows its id)."""
    try:
        expires_in = parse_duration_s(expires)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--expires") from None
    made = Client().post("/agent-tokens", {"pools": list(pools), "expires_in": expires_in})
    click.echo(json.dumps(made, indent=2) if as_json else made["token"])
