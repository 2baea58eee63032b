"""Pages for what the API offers beyond tasks appear exactly when the API has it, and act
through it as the signed-in browser: apps (launch forms from JSON Schemas, running apps,
stop, refusals shown as the API says them) and clone, here against stand-in routes."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi import Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from broker.api.app import API
from broker.api.auth import web_caller
from broker.domain import TaskSpec
from broker.estate import builtin_estate
from broker.server import build_app
from broker.store.repository import Store

SCHEMA = {
    "type": "object",
    "required": ["image"],
    "properties": {
        "image": {"type": "string", "title": "Image", "default": "jupyter/base"},
        "gpus": {"type": "integer", "minimum": 0, "default": 1},
    },
}
REFUSAL = "team vision may launch at most 4 GPUs of apps; ask the platform team for more"


def _server(tmp_path, with_features: bool) -> tuple[TestClient, Store, list[Any]]:
    store = Store.open(f"sqlite:///{tmp_path / 'k.db'}")
    app = build_app(builtin_estate(), store, tmp_path, "http://127.0.0.1:9")
    calls: list[Any] = []
    if with_features:

        def apps() -> list[dict[str, Any]]:
            return [{"name": "notebook", "description": "Jupyter on a GPU", "schema": SCHEMA}]

        def running() -> list[dict[str, Any]]:
            url = "/apps/a1/"
            return [{"id": "a1", "name": "notebook", "state": "running", "url": url, "reason": ""}]

        async def launch(name: str, request: Request) -> JSONResponse:
            body = await request.json()
            calls.append(("launch", name, body, web_caller(store, request)))
            if body["gpus"] > 4:
                return JSONResponse({"detail": REFUSAL}, status_code=403)
            return JSONResponse({"id": "a2"}, status_code=201)

        def stop(app_id: str, request: Request) -> dict[str, str]:
            calls.append(("stop", app_id, web_caller(store, request)))
            return {"id": app_id}

        async def clone(task_id: int, request: Request) -> dict[str, int]:
            calls.append(("clone", task_id, await request.json(), web_caller(store, request)))
            return {"id": 99}

        app.add_api_route(f"{API}/apps", apps, methods=["GET"])
        app.add_api_route(f"{API}/apps/running", running, methods=["GET"])
        app.add_api_route(f"{API}/apps/{{name}}/launch", launch, methods=["POST"])
        app.add_api_route(f"{API}/apps/running/{{app_id}}/stop", stop, methods=["POST"])
        app.add_api_route(f"{API}/tasks/{{task_id}}/clone", clone, methods=["POST"])
    client = TestClient(app, follow_redirects=False)
    form = client.get("/login").text
    login_token = re.search(r'name="login_token" value="([^"]+)"', form)[1]  # type: ignore[index]
    signed = client.post(
        "/login", data={"token": store.add_token("alice"), "login_token": login_token}
    )
    assert signed.status_code == 303
    return client, store, calls


def _csrf(page: str) -> str:
    return re.search(r'name="csrf" value="([0-9a-f]+)"', page)[1]  # type: ignore[index]


@pytest.fixture
def featured(tmp_path):
    client, store, calls = _server(tmp_path, with_features=True)
    yield client, store, calls
    store.close()


def test_apps_launch_from_their_schema_and_refusals_read_as_the_api_says(featured) -> None:
    client, _, calls = featured
    page = client.get("/apps").text
    assert 'href="/apps"' in page  # in the navigation
    assert 'name="field.image" value="jupyter/base"' in page and "Image (required)" in page
    assert 'href="/apps/a1/"' in page and "/apps/running/a1/stop" in page
    csrf = _csrf(page)
    done = client.post(
        "/apps/notebook/launch", data={"csrf": csrf, "field.image": "pytorch", "field.gpus": "2"}
    )
    assert done.status_code == 303 and done.headers["location"] == "/apps"
    assert calls[-1] == ("launch", "notebook", {"image": "pytorch", "gpus": 2}, ("alice", False))
    refused = client.post(
        "/apps/notebook/launch", data={"csrf": csrf, "field.image": "x", "field.gpus": "8"}
    )
    shown = client.get(refused.headers["location"]).text
    assert REFUSAL in shown
    client.post("/apps/running/a1/stop", data={"csrf": csrf})
    assert calls[-1] == ("stop", "a1", ("alice", False))


def test_clone_enqueues_through_the_api_as_the_signed_in_user(featured) -> None:
    client, store, calls = featured
    task = store.create_task(TaskSpec(("python", "train.py"), "cpu"), "alice", None)
    page = client.get(f"/tasks/{task.id}").text
    assert f'href="/tasks/{task.id}/clone"' in page
    form = client.get(f"/tasks/{task.id}/clone").text
    answer = client.post(f"/tasks/{task.id}/clone", data={"csrf": _csrf(form)})
    assert answer.status_code == 303 and answer.headers["location"] == "/tasks/99"
    assert calls[-1] == ("clone", task.id, {"parameters": {}}, ("alice", False))


def test_without_those_routes_the_pages_say_so_and_link_nowhere(tmp_path) -> None:
    client, store, _ = _server(tmp_path, with_features=False)
    task = store.create_task(TaskSpec(("python", "train.py"), "cpu"), "alice", None)
    page = client.get(f"/tasks/{task.id}").text
    assert 'href="/apps"' not in page and "/clone" not in page
    assert "Artifacts" not in page and "Parameters" not in page
    assert client.get("/apps").status_code == 404
    assert client.get(f"/tasks/{task.id}/clone").status_code == 404
    store.close()
