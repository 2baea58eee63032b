"""Pages for what the API offers beyond tasks appear exactly when the API has it, and act
through it as the signed-in browser: apps through the API's own routes (launch forms from the
catalogue's JSON Schemas, running apps and their routes, stop, refusals shown as the API says
them), and clone, against a stand-in route (the API has none yet)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi import Request
from fastapi.testclient import TestClient

from broker.api.app import API
from broker.api.auth import Auth
from broker.domain import TaskSpec
from broker.estate import builtin_estate
from broker.server import build_app
from broker.store.repository import Store

LOCKED = "a new JupyterLab image is being rolled out"


def _server(tmp_path, with_clone: bool) -> tuple[TestClient, Store, list[Any]]:
    store = Store.open(f"sqlite:///{tmp_path / 'k.db'}")
    app = build_app(builtin_estate(), store, tmp_path, "http://127.0.0.1:9")
    calls: list[Any] = []
    if with_clone:

        async def clone(task_id: int, request: Request, who: Auth) -> dict[str, int]:
            calls.append(("clone", task_id, await request.json(), (who.user, who.admin)))
            return {"id": 99}

        app.add_api_route(f"{API}/tasks/{{task_id}}/clone", clone, methods=["POST"])
        app.router.routes.insert(0, app.router.routes.pop())  # before the catch-all mounts
    client = TestClient(app, follow_redirects=False)
    form = client.get("/login").text
    login_token = re.search(r'name="login_token" value="([^"]+)"', form)[1]  # type: ignore[index]
    signed = client.post(
        "/login", data={"token": store.add_token("alice"), "login_token": login_token}
    )
    assert signed.status_code == 303
    return client, store, calls


def _csrf(page: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', page)[1]  # type: ignore[index]


@pytest.fixture
def featured(tmp_path):
    client, store, calls = _server(tmp_path, with_clone=True)
    yield client, store, calls
    store.close()


def test_apps_launch_from_the_catalogue_and_refusals_read_as_the_api_says(featured) -> None:
    client, store, _ = featured
    page = client.get("/apps").text
    assert 'href="/apps"' in page  # in the navigation
    assert 'action="/apps/jupyter/launch"' in page and 'name="field.packages" value="[]"' in page
    csrf = _csrf(page)
    done = client.post(
        "/apps/jupyter/launch",
        data={"csrf": csrf, "resource": "cpu", "field.packages": '["polars"]'},
    )
    assert done.status_code == 303 and done.headers["location"] == "/apps"
    (task,) = store.tasks(owner="alice")
    assert task.spec.app and task.spec.app["name"] == "jupyter" and task.spec.resource == "cpu"
    assert task.spec.app["params"]["packages"] == ["polars"]
    page = client.get("/apps").text
    route = task.spec.app["route"]
    assert f"/apps/instances/{task.id}/stop" in page and f"/routes/{route}/" in page
    admin = store.add_token("root-team", admin=True)
    headers = {"Authorization": f"Bearer {admin}"}
    client.put(f"{API}/apps/jupyter/lock", json={"reason": LOCKED}, headers=headers)
    refused = client.post("/apps/jupyter/launch", data={"csrf": csrf, "resource": "cpu"})
    shown = client.get(refused.headers["location"]).text
    assert LOCKED in shown and "is locked by the platform team" in shown
    stopped = client.post(f"/apps/instances/{task.id}/stop", data={"csrf": csrf})
    assert stopped.status_code == 303 and stopped.headers["location"] == "/apps"
    assert store.get(task.id).state.value == "cancelled"


def test_clone_enqueues_through_the_api_as_the_signed_in_user(featured) -> None:
    client, store, calls = featured
    task = store.create_task(TaskSpec(("python", "train.py"), "cpu"), "alice", None)
    page = client.get(f"/tasks/{task.id}").text
    assert f'href="/tasks/{task.id}/clone"' in page
    form = client.get(f"/tasks/{task.id}/clone").text
    answer = client.post(f"/tasks/{task.id}/clone", data={"csrf": _csrf(form)})
    assert answer.status_code == 303 and answer.headers["location"] == "/tasks/99"
    assert calls[-1] == ("clone", task.id, {"parameters": {}}, ("alice", False))


def test_without_a_clone_route_the_pages_say_so_and_link_nowhere(tmp_path) -> None:
    client, store, _ = _server(tmp_path, with_clone=False)
    task = store.create_task(TaskSpec(("python", "train.py"), "cpu"), "alice", None)
    page = client.get(f"/tasks/{task.id}").text
    assert "/clone" not in page
    assert "Artifacts" not in page and "Parameters" not in page
    assert client.get(f"/tasks/{task.id}/clone").status_code == 404
    store.close()
