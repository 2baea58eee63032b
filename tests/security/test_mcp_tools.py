"""MCP tools act as their caller and no one else: bob's agent, with bob's token, can neither
see nor touch alice's tasks and apps, whichever tool it calls."""

from __future__ import annotations

import asyncio
import json

from helpers.app import call, echo_command, launch, mcp_session, wait_ready

from .conftest import Attack, submit


def test_mcp_tools_on_another_users_tasks_are_refused(attack_factory) -> None:
    attack: Attack = attack_factory("host")
    server = attack.server
    task_id = submit(attack, attack.alice, "echo alice-secret-output; sleep 600")
    server.wait_state(task_id, {"running"}, token=attack.alice)
    app = launch(server, attack.alice, "http", params={"command": echo_command("alice")})
    wait_ready(server, attack.alice, app["id"])

    async def as_bob() -> list[tuple[str, bool, str]]:
        seen = []
        async with mcp_session(server, attack.bob) as session:
            for tool, arguments in (
                ("show_task", {"task_id": task_id}),
                ("task_logs", {"task_id": task_id}),
                ("why_task", {"task_id": task_id}),
                ("cancel_task", {"task_id": task_id}),
                ("compare_runs", {"task_ids": [task_id]}),
                ("stop_app", {"task_id": app["id"]}),
                ("cancel_task", {"task_id": app["id"]}),
                ("list_runs", {}),
                ("list_apps", {}),
                ("usage", {"by": "user"}),
            ):
                refused, text = await call(session, tool, **arguments)
                seen.append((tool, refused, text))
        return seen

    seen = asyncio.run(as_bob())
    for tool, refused, text in seen[:7]:
        assert refused and "of yours" in text, (tool, text)
    assert all("alice-secret-output" not in text for _, _, text in seen)
    listings = {tool: json.loads(text) for tool, _, text in seen[7:]}
    assert listings["list_runs"] == []
    assert listings["list_apps"]["running"] == []
    assert listings["usage"]["rows"] == []
    assert server.task(task_id, attack.alice)["state"] == "running"
    assert server.task(app["id"], attack.alice)["state"] == "running"
    server.cli("cancel", str(task_id), str(app["id"]), token=attack.alice)
