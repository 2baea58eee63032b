"""The MCP server at /mcp, driven by the official SDK's own client over HTTP: every tool works
as the calling user, and a locked app, a full quota and an unmapped account come back as
readable refusals (another user's tasks: tests/security/test_mcp_tools.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from conftest import HOST_ACCESS, Server, wait_for
from helpers.app import call, echo_command, mcp_session

ESTATE = (
    "teams:\n  vision: [alice, carol]\n  nlp: [bob]\n"
    "resources:\n  cpu:\n    profile: {cpus: 1, memory: 1G, walltime: 1h, pools: [p]}\n"
    f"pools:\n  p:\n    kind: host\n    slots: 4\n    {HOST_ACCESS}\n"
    "apps: {max_running_per_team: {vision: 1}}\n"
)
TOOLS = {
    "list_compute_resources",
    "submit_task",
    "show_task",
    "task_logs",
    "why_task",
    "cancel_task",
    "list_runs",
    "compare_runs",
    "usage",
    "list_apps",
    "launch_app",
    "stop_app",
    "list_models",  # the model registry's (tests/integration/test_models.py)
    "show_model",
    "promote_model",
    "list_tunings",  # tuning's (tests/integration/test_tuning.py)
    "show_tuning",
    "list_datasets",  # datasets' (tests/integration/test_datasets.py)
    "show_dataset",
}


def answer(outcome: tuple[bool, str]) -> Any:
    refused, text = outcome
    assert not refused, text
    return json.loads(text)


@pytest.fixture
def server(server_factory) -> Server:
    return server_factory(ESTATE)


def test_the_protected_resource_metadata_and_the_bearer_token(server):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        metadata = http.get("/.well-known/oauth-protected-resource/mcp").json()
        bare = http.post("/mcp", json={})
        elsewhere = http.get("/mcpx")  # not MCP's: the API's own JSON 404
    assert (elsewhere.status_code, elsewhere.json()) == (404, {"detail": "Not Found"})
    assert metadata["resource"] == f"{server.url}/mcp"
    assert metadata["bearer_methods_supported"] == ["header"]
    assert bare.status_code == 401
    assert "oauth-protected-resource" in bare.headers["www-authenticate"]


def test_every_tool_works_as_the_calling_user(server):
    alice = server.make_token("alice")

    async def scenario() -> None:
        async with mcp_session(server, alice) as session:
            assert {t.name for t in (await session.list_tools()).tools} == TOOLS
            resources = answer(await call(session, "list_compute_resources"))
            assert [(r["name"], r["permitted"]) for r in resources] == [("cpu", True)]
            command = ["sh", "-c", "echo from-mcp; sleep 1"]
            done = answer(await call(session, "submit_task", command=command, name="one"))
            assert done["state"] in ("queued", "placed", "submitted", "pending", "running")
            long = answer(await call(session, "submit_task", command=["sleep", "600"]))
            await _until(session, done["id"], {"completed"})
            shown = answer(await call(session, "show_task", task_id=done["id"]))
            assert shown["owner"] == "alice" and shown["name"] == "one"
            logs = answer(await call(session, "task_logs", task_id=done["id"]))
            assert "from-mcp" in logs["text"]
            why = answer(await call(session, "why_task", task_id=done["id"]))
            assert why["waiting"] is False
            runs = answer(await call(session, "list_runs"))
            assert [r["id"] for r in runs] == [long["id"], done["id"]]
            compared = answer(await call(session, "compare_runs", task_ids=[done["id"]]))
            assert compared[0]["state"] == "completed" and compared[0]["runtime_s"] > 0
            cancelled = answer(await call(session, "cancel_task", task_id=long["id"]))
            assert cancelled["state"] == "cancelled"
            usage = answer(await call(session, "usage", by="user"))
            assert [row["key"] for row in usage["rows"]] == ["alice"]
            catalogue = answer(await call(session, "list_apps"))
            assert "jupyter" in {a["name"] for a in catalogue["catalogue"]}
            params = {"command": echo_command("mcp")}
            app = answer(await call(session, "launch_app", app="http", params=params))
            assert app["owner"] == "alice" and app["path"].startswith("/routes/http-")
            stopped = answer(await call(session, "stop_app", task_id=app["id"]))
            assert stopped["state"] == "cancelled"

    asyncio.run(scenario())


async def _until(session: Any, task_id: int, states: set[str]) -> dict[str, Any]:
    for _ in range(600):
        task = answer(await call(session, "show_task", task_id=task_id))
        if task["state"] in states:
            return task
        await asyncio.sleep(0.1)
    raise AssertionError(f"task {task_id} never reached {states}: {task}")


def test_locks_quotas_and_unmapped_accounts_are_readable_refusals(server):
    alice, carol = server.make_token("alice"), server.make_token("carol")
    assert server.cli("app", "lock", "vllm", "--reason", "driver upgrade").exit_code == 0

    async def scenario() -> None:
        async with mcp_session(server, alice) as session:
            refused, text = await call(session, "launch_app", app="vllm", params={"model": "a/b"})
            assert refused and "app vllm is locked by the platform team (driver upgrade)" in text
            params = {"command": echo_command("one")}
            answer(await call(session, "launch_app", app="http", params=params))
            refused, text = await call(session, "launch_app", app="http", params=params)
            assert refused and "team vision's quota of 1 running apps is reached" in text, text
            assert "apps.max_running_per_team" in text
        async with mcp_session(server, carol) as session:
            refused, text = await call(session, "submit_task", command=["true"])
            assert refused and "user carol is not in the user_map of pool p" in text, text

    asyncio.run(scenario())
    cli = server.cli("app", "launch", "http", "--param", 'command=["true"]', token=alice)
    assert cli.exit_code == 1
    assert cli.output.startswith("klique: team vision's quota of 1 running apps is reached")
    with server.api(alice) as api:
        over = api.post("/apps/http/launch", json={"params": {"command": ["true"]}})
    assert over.status_code == 403 and "quota" in over.json()["detail"]
    for instance in json.loads(server.cli("app", "ls", "--json", token=alice).output):
        server.cli("app", "stop", str(instance["id"]), token=alice)
    wait_for(lambda: json.loads(server.cli("app", "ls", "--json", token=alice).output) == [], 30)
