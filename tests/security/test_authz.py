"""One authorization layer (broker/authz.py), attacked where entry points used to decide on their
own: cloning an app task must meet every rule a launch meets (the app's lock, its compute
resources, the running-app quotas, a static route's teams), and a session signed in with a
submit-only token must not read through the web UI what the API refuses it, nor through MCP."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
from conftest import HOST_ACCESS, TASK_PY, Server
from helpers.app import ECHO, call, mcp_session
from helpers.web_session import signed_in

ESTATE = (
    "teams:\n  vision: [alice]\n  nlp: [bob]\n"
    "resources:\n"
    "  cpu:\n    profile: {cpus: 1, memory: 200M, walltime: 10m, pools: [p]}\n"
    "  other:\n    profile: {cpus: 1, memory: 200M, walltime: 10m, pools: [p]}\n"
    f"pools:\n  p:\n    kind: host\n    slots: 8\n    {HOST_ACCESS}\n"
    "apps: {catalogue: $CATALOGUE, max_running_per_team: {vision: 2}}\n"
)


@pytest.fixture(scope="module")
def apps(module_server_factory, tmp_path_factory) -> tuple[Server, str, str]:
    """A server whose catalogue has `echo`, an endpoint that may use compute resource cpu only;
    alice's team may run two apps at once."""
    catalogue = tmp_path_factory.mktemp("catalogue")
    echo = {
        "kind": "endpoint",
        "resources": ["cpu"],
        "form": {"type": "object", "properties": {}},
        "command": [TASK_PY, "-c", ECHO, "{port}", "echo"],
    }
    (catalogue / "echo.yaml").write_text(json.dumps(echo))
    server = module_server_factory(ESTATE.replace("$CATALOGUE", str(catalogue)))
    return server, server.make_token("alice"), server.make_token("bob")


@pytest.fixture
def alices_apps(apps) -> Iterator[list[int]]:
    """The app tasks a test makes as alice (append their ids): all stopped at its end, so that
    the next test starts under the quota with no lock."""
    server, alice, _ = apps
    made: list[int] = []
    yield made
    with server.api(alice) as api:
        for task_id in made:
            api.post(f"/apps/instances/{task_id}/stop")
    with server.api() as admin:
        admin.delete("/apps/echo/lock")


def launch(server: Server, token: str, made: list[int], **body: object) -> dict[str, object]:
    with server.api(token) as api:
        answer = api.post("/apps/echo/launch", json=body)
    assert answer.status_code == 201, answer.text
    made.append(int(answer.json()["id"]))
    return answer.json()  # type: ignore[no-any-return]


def clone(
    server: Server, token: str, task_id: int, made: list[int], **body: object
) -> httpx.Response:
    with server.api(token) as api:
        answer = api.post(f"/sdk/tasks/{task_id}/clone", json=body)
    if answer.status_code == 201:
        made.append(int(answer.json()["id"]))
    return answer


def test_cloning_an_app_task_meets_the_apps_lock(apps, alices_apps) -> None:
    server, alice, _ = apps
    task = launch(server, alice, alices_apps)
    with server.api() as admin:
        assert admin.put("/apps/echo/lock", json={"reason": "upgrade"}).status_code == 200
    refused = clone(server, alice, int(task["id"]), alices_apps)  # type: ignore[arg-type]
    assert refused.status_code == 403 and "locked" in refused.text, refused.text


def test_cloning_an_app_task_meets_the_running_app_quota(apps, alices_apps) -> None:
    server, alice, _ = apps
    first = launch(server, alice, alices_apps)
    launch(server, alice, alices_apps)
    refused = clone(server, alice, int(first["id"]), alices_apps)  # type: ignore[arg-type]
    assert refused.status_code == 403 and "max_running_per_team" in refused.text, refused.text


def test_cloning_an_app_task_meets_the_apps_compute_resources(apps, alices_apps) -> None:
    server, alice, _ = apps
    task = launch(server, alice, alices_apps)
    task_id = int(task["id"])  # type: ignore[arg-type]
    refused = clone(server, alice, task_id, alices_apps, resource="other")
    assert refused.status_code == 403 and "only the compute resources cpu" in refused.text
    # Where a launch would be let in, so is the clone: an app task of its own, on its own route.
    again = clone(server, alice, task_id, alices_apps)
    assert again.status_code == 201, again.text
    with server.api(alice) as api:
        copy = api.get(f"/apps/instances/{again.json()['id']}").json()
    assert copy["app"] == "echo" and copy["route"] != task["route"]


def test_cloning_an_app_task_meets_a_static_routes_teams(apps, alices_apps) -> None:
    server, alice, _ = apps
    with server.api() as admin:
        made = admin.post("/routes", json={"name": "serving", "teams": ["vision"]})
        assert made.status_code == 201, made.text
    try:
        task = launch(server, alice, alices_apps, route="serving")
        # The route changes hands: it now belongs to team nlp, whose clients call it.
        with server.api() as admin:
            assert admin.delete("/routes/serving").status_code == 200
            assert admin.post("/routes", json={"name": "serving", "teams": ["nlp"]}).is_success
        refused = clone(server, alice, int(task["id"]), alices_apps)  # type: ignore[arg-type]
        assert refused.status_code == 403 and "belongs to the teams nlp" in refused.text
    finally:
        with server.api() as admin:
            admin.delete("/routes/serving")


def submit_only_token(server: Server, user: str) -> str:
    with server.api() as admin:
        made = admin.post("/tokens", json={"user": user, "scopes": ["submit"]})
    assert made.status_code == 201, made.text
    return str(made.json()["token"])


def test_a_submit_only_session_reads_no_page(apps) -> None:
    server, alice, _ = apps
    secret = "alices-submit-only-secret"
    victim = submit_task(server, alice, secret)
    looker = signed_in(server, submit_only_token(server, "alice"))
    try:
        html = {"Accept": "text/html"}
        for path in (
            "/tasks",
            f"/tasks/{victim}",
            f"/compare?ids={victim}",
            f"/tasks/{victim}/clone",
            f"/events/tasks/{victim}",
            f"/events/tasks?ids={victim}&page=first&top=0&since=0",
            "/usage",
            "/usage.csv",
            "/pools",
        ):
            page = looker.get(path, headers=html)
            assert page.status_code == 403, (path, page.status_code)
            assert secret not in page.text, (path, page.text)
            assert "--scope read" in page.text, path  # what to ask for
        assert looker.get(f"/api/v1/tasks/{victim}/logs").status_code == 403
    finally:
        looker.close()
        with server.api(alice) as api:
            api.post(f"/tasks/{victim}/cancel")


def test_a_submit_only_token_submits_but_reads_nothing_through_mcp(apps) -> None:
    server, alice, _ = apps
    secret = "alices-mcp-secret"
    victim = submit_task(server, alice, secret)
    token = submit_only_token(server, "alice")
    made: list[int] = []

    async def as_submit_only() -> list[tuple[str, bool, str]]:
        seen = []
        async with mcp_session(server, token) as session:
            refused, text = await call(session, "submit_task", command=["true"], resource="cpu")
            assert not refused, text  # what it may do, it does (without reading back)
            made.append(int(json.loads(text)["id"]))
            for tool, arguments in (
                ("show_task", {"task_id": victim}),
                ("task_logs", {"task_id": victim}),
                ("why_task", {"task_id": victim}),
                ("compare_runs", {"task_ids": [victim]}),
                ("list_runs", {}),
                ("list_apps", {}),
                ("usage", {"by": "user"}),
                ("list_compute_resources", {}),
            ):
                refused, text = await call(session, tool, **arguments)
                seen.append((tool, refused, text))
        return seen

    try:
        for tool, refused, text in asyncio.run(as_submit_only()):
            assert refused and "the 'read' scope" in text, (tool, text)
            assert secret not in text, tool
    finally:
        with server.api(alice) as api:
            for task_id in (victim, *made):
                api.post(f"/tasks/{task_id}/cancel")


def submit_task(server: Server, token: str, name: str) -> int:
    with server.api(token) as api:
        answer = api.post(
            "/tasks",
            json={"command": ["sleep", "600"], "resource": "cpu", "name": name},
        )
    assert answer.status_code in (200, 201), answer.text
    return int(answer.json()["id"])
