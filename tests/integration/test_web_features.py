"""Pages for what the API offers beyond tasks appear exactly when the API has it, and act
through it as the signed-in browser: apps through the API's own routes (launch forms from the
catalogue's JSON Schemas, running apps and their routes, stop, refusals shown as the API says
them), a task's parameters and artifacts, and clone with edited parameters through the SDK's
route."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from broker.domain import TaskSpec
from broker.estate import builtin_estate
from broker.http.paths import API
from broker.server import build_app
from broker.store.identity import IdentityStore
from broker.store.repository import Store
from broker.web.features import CLONE

LOCKED = "a new JupyterLab image is being rolled out"


def _server(tmp_path, with_clone: bool) -> tuple[TestClient, Store]:
    store = Store.open(f"sqlite:///{tmp_path / 'k.db'}")
    app = build_app(builtin_estate(), store, tmp_path, "http://127.0.0.1:9")
    if not with_clone:  # an API whose OpenAPI document lists no clone: the pages offer none
        schema = app.openapi()
        paths = {path: ops for path, ops in schema["paths"].items() if path != CLONE}
        app.openapi = lambda: {**schema, "paths": paths}  # type: ignore[method-assign]
    client = TestClient(app, follow_redirects=False)
    form = client.get("/login").text
    login_token = re.search(r'name="login_token" value="([^"]+)"', form)[1]  # type: ignore[index]
    signed = client.post(
        "/login",
        data={"token": IdentityStore(store).add_token("alice")[0], "login_token": login_token},
    )
    assert signed.status_code == 303
    return client, store


def _csrf(page: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', page)[1]  # type: ignore[index]


@pytest.fixture
def featured(tmp_path):
    client, store = _server(tmp_path, with_clone=True)
    yield client, store
    store.close()


def test_apps_launch_from_the_catalogue_and_refusals_read_as_the_api_says(featured) -> None:
    client, store = featured
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
    admin, _ = IdentityStore(store).add_token("root-team", kind="admin")
    headers = {"Authorization": f"Bearer {admin}"}
    client.put(f"{API}/apps/jupyter/lock", json={"reason": LOCKED}, headers=headers)
    refused = client.post("/apps/jupyter/launch", data={"csrf": csrf, "resource": "cpu"})
    shown = client.get(refused.headers["location"]).text
    assert LOCKED in shown and "is locked by the platform team" in shown
    stopped = client.post(f"/apps/instances/{task.id}/stop", data={"csrf": csrf})
    assert stopped.status_code == 303 and stopped.headers["location"] == "/apps"
    assert store.get(task.id).state.value == "cancelled"


def test_a_tasks_parameters_and_artifacts_show_as_the_api_has_them(featured) -> None:
    client, store = featured
    spec = TaskSpec(("python", "train.py"), "cpu")
    task = store.create_task(spec, "alice", None, record={"parameters": {"lr": 0.1}})
    page = client.get(f"/tasks/{task.id}").text
    assert "Parameters" in page and "lr" in page and "0.1" in page
    assert "Artifacts" in page and "No artifacts." in page


def test_clone_enqueues_through_the_api_as_the_signed_in_user(featured) -> None:
    client, store = featured
    spec = TaskSpec(("python", "train.py"), "cpu")
    task = store.create_task(spec, "alice", None, record={"parameters": {"lr": 0.1}})
    page = client.get(f"/tasks/{task.id}").text
    assert f'href="/tasks/{task.id}/clone"' in page
    form = client.get(f"/tasks/{task.id}/clone").text
    answer = client.post(f"/tasks/{task.id}/clone", data={"csrf": _csrf(form), "param.lr": "0.01"})
    assert answer.status_code == 303
    new_id = int(answer.headers["location"].removeprefix("/tasks/"))
    clone = store.get(new_id)
    assert new_id != task.id and clone.owner == "alice"
    assert clone.parameters == {"lr": 0.01} and clone.spec.command == spec.command


def test_without_a_clone_route_the_pages_say_so_and_link_nowhere(tmp_path) -> None:
    client, store = _server(tmp_path, with_clone=False)
    task = store.create_task(TaskSpec(("python", "train.py"), "cpu"), "alice", None)
    page = client.get(f"/tasks/{task.id}").text
    assert "/clone" not in page
    assert client.get(f"/tasks/{task.id}/clone").status_code == 404
    store.close()
