"""Apps from the CLI: a launch form exported to JSON and launched again the same way, an admin
lock refusing a launch with one sentence, and an app that ends at its walltime as a timeout."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import HOST_ACCESS
from helpers.app import echo_command, wait_ready

ESTATE = (
    "teams:\n  vision: [alice]\n"
    "resources:\n  cpu:\n    profile: {cpus: 1, memory: 1G, walltime: 1h, pools: [p]}\n"
    f"pools:\n  p:\n    kind: host\n    slots: 2\n    {HOST_ACCESS}\n"
)


def test_a_launch_form_exports_and_launches_again_the_same(server_factory, tmp_path: Path):
    server = server_factory(ESTATE)
    alice = server.make_token("alice")
    command = json.dumps(echo_command("from-a-form"))
    exported = server.cli(
        "app", "export", "http", "-r", "cpu", "--param", f"command={command}", token=alice
    )
    assert exported.exit_code == 0, exported.output
    form = json.loads(exported.output)
    assert form["app"] == "http" and form["params"]["ready_path"] == "/"  # defaults filled
    path = tmp_path / "form.json"
    path.write_text(exported.output)
    launched = server.cli("app", "launch", "--form", str(path), "--wait", "--json", token=alice)
    assert launched.exit_code == 0, launched.output
    instance = json.loads(launched.stdout)  # progress goes to stderr meanwhile
    assert instance["ready"] and instance["params"] == form["params"]
    again = server.cli("app", "export", "--id", str(instance["id"]), token=alice)
    assert json.loads(again.output)["params"] == form["params"]
    assert server.cli("app", "stop", str(instance["id"]), token=alice).exit_code == 0


def test_a_locked_app_is_refused_with_one_sentence_until_unlocked(server_factory):
    server = server_factory(ESTATE)
    alice = server.make_token("alice")
    theirs = server.cli("app", "lock", "http", "--reason", "mine now", token=alice)
    assert theirs.exit_code == 1 and "only an admin token can lock an app" in theirs.output
    assert server.cli("app", "lock", "http", "--reason", "the proxy is moving").exit_code == 0
    command = json.dumps(echo_command("locked"))
    refused = server.cli("app", "launch", "http", "--param", f"command={command}", token=alice)
    assert refused.exit_code == 1
    assert refused.output == (
        "klique: app http is locked by the platform team (the proxy is moving); launch another "
        "app, or ask them to unlock it (`klique app unlock http`)\n"
    )
    listed = json.loads(server.cli("app", "list", "--json", token=alice).output)
    assert next(a for a in listed if a["name"] == "http")["lock_reason"] == "the proxy is moving"
    assert server.cli("app", "unlock", "http").exit_code == 0
    launched = server.cli("app", "launch", "http", "--param", f"command={command}", token=alice)
    assert launched.exit_code == 0, launched.output
    for instance in json.loads(server.cli("app", "ls", "--json", token=alice).output):
        server.cli("app", "stop", str(instance["id"]), token=alice)


def test_an_app_ends_at_its_walltime_as_a_timeout(server_factory):
    server = server_factory(ESTATE)
    alice = server.make_token("alice")
    with server.api(alice) as api:
        answer = api.post(
            "/apps/http/launch",
            json={"params": {"command": echo_command("brief")}, "walltime_s": 5},
        )
    assert answer.status_code == 201, answer.text
    task_id = answer.json()["id"]
    wait_ready(server, alice, task_id)
    task = server.wait_state(task_id, token=alice)
    assert task["state"] == "timeout", task
    assert task["reason"] == "ran past its walltime (5 s); the app was stopped"
