"""`klique token create / ls / revoke` for service users, as an admin uses them."""

from __future__ import annotations

import json
import time

from conftest import Server


def test_a_service_token_is_made_listed_used_and_revoked_from_the_cli(host_server: Server):
    server = host_server
    made = server.cli(
        "token",
        "create",
        "--service",
        "ci-bot",
        "--team",
        "vision",
        "--scope",
        "read",
        "--expires",
        "30d",
        "--json",
    )
    assert made.exit_code == 0, made.output
    token = json.loads(made.output)
    assert (token["kind"], token["user"], token["team"], token["scopes"]) == (
        "service",
        "ci-bot",
        "vision",
        ["read"],
    )
    assert 29 * 86400 < token["expires_at"] - time.time() <= 30 * 86400
    assert server.cli("ls", token=token["token"]).exit_code == 0  # it may read
    table = server.cli("token", "ls").output
    line = next(line for line in table.splitlines() if line.startswith(token["id"]))
    assert line.split()[:5] == [token["id"], "service", "ci-bot", "vision", "read"]
    assert line.rstrip().endswith("in force") and token["token"] not in table
    revoked = server.cli("token", "revoke", token["id"])
    assert revoked.output.strip() == f"token {token['id']} of ci-bot revoked"
    assert server.cli("token", "ls").output.count("revoked") == 1
    refused = server.cli("ls", token=token["token"])
    assert refused.exit_code == 1 and "was revoked" in refused.output


def test_token_create_says_what_is_wrong(host_server: Server) -> None:
    both = host_server.cli("token", "create", "alice", "--service", "ci-bot")
    assert both.exit_code == 2 and "either USER or --service NAME" in both.output
    when = host_server.cli("token", "create", "alice", "--expires", "soon")
    assert when.exit_code == 2 and "is not a duration" in when.output
    team = host_server.cli("token", "create", "alice", "--team", "vision")
    assert team.exit_code == 1 and "--team is for service users" in team.output
    lonely = host_server.cli("token", "create", "--service", "ci-bot")
    assert lonely.exit_code == 1 and "a service user needs --team" in lonely.output
