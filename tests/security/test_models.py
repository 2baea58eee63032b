"""Attacks on the model registry: another team promoting (or adding versions to) a model, a
job's report token fetching a model version its launch did not resolve, and a model's name or
file path reaching a path outside its place."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import HOST_ACCESS, Server, wait_for
from helpers.app import call, launch, mcp_session, stop

from inside_job.errors import SetupFailed
from inside_job.models import StagedModel

ESTATE = (
    "teams:\n  vision: [alice, carol]\n  nlp: [bob]\n"
    "resources:\n  cpu:\n    profile: {cpus: 1, memory: 200M, walltime: 10m, pools: [p]}\n"
    f"pools:\n  p:\n    kind: host\n    slots: 4\n    {HOST_ACCESS}\n"
)


def api(server: Server, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def run_with_model(server: Server, token: str, name: str, *contents: bytes) -> dict[str, Any]:
    """A run recorded where it runs, registering a version of `name` with each content."""
    with api(server, token) as http:
        run = http.post("/sdk/tasks", json={"command": ["python3", "train.py"], "name": "train"})
        assert run.status_code == 201, run.text
        task_id = run.json()["id"]
        for index, content in enumerate(contents):
            put = http.put(f"/tasks/{task_id}/artifacts/w{index}?kind=file", content=content)
            assert put.status_code == 201, put.text
            body = {
                "name": name,
                "task": task_id,
                "files": [{"path": "w.bin", "artifact": f"w{index}"}],
            }
            made = http.post("/models", json=body)
            assert made.status_code == 201, made.text
    return dict(run.json())


def run_with_artifact(http: httpx.Client, content: bytes) -> int:
    """The id of a run recorded where it runs, holding one file artifact `w` of `content`."""
    run = http.post("/sdk/tasks", json={"command": ["python3"], "name": "x"}).json()
    http.put(f"/tasks/{run['id']}/artifacts/w?kind=file", content=content)
    return int(run["id"])


@pytest.fixture(scope="module")
def registry(module_server_factory):
    """One server for the module's attacks: alice's (team vision) models demo (2 versions) and
    secret; bob is of team nlp, carol of vision."""
    server = module_server_factory(ESTATE)
    tokens = {user: server.make_token(user) for user in ("alice", "bob", "carol")}
    run_with_model(server, tokens["alice"], "demo", b"version one", b"version two")
    run_with_model(server, tokens["alice"], "secret", b"alice's other model")
    return server, tokens


def stages(server: Server, name: str) -> dict[int, str]:
    with api(server, server.token) as http:
        return {v["version"]: v["stage"] for v in http.get(f"/models/{name}").json()["versions"]}


def test_another_team_can_neither_promote_nor_see_nor_add_to_a_model(registry) -> None:
    server, tokens = registry
    before = stages(server, "demo")
    with api(server, tokens["bob"]) as bob:
        promoted = bob.post("/models/demo/versions/2/stage", json={"stage": "production"})
        assert promoted.status_code == 404, promoted.text
        assert "klique model ls" in promoted.json()["detail"]
        assert bob.get("/models").json() == []
        assert bob.get("/models/demo").status_code == 404
        assert bob.get("/models/demo/versions/1/files/0").status_code == 404
        body = {
            "name": "demo",
            "task": run_with_artifact(bob, b"bob's"),
            "files": [{"path": "w", "artifact": "w"}],
        }
        added = bob.post("/models", json=body)
        assert added.status_code == 403 and "team vision" in added.json()["detail"], added.text
    assert stages(server, "demo") == before  # nothing changed
    assert len(stages(server, "demo")) == 2
    with api(server, tokens["carol"]) as carol:  # the model's team may
        moved = carol.post("/models/demo/versions/1/stage", json={"stage": "staging"})
        assert moved.status_code == 200, moved.text
    assert stages(server, "demo")[1] == "staging"


def test_a_job_reads_only_the_model_versions_its_launch_resolved(registry) -> None:
    server, tokens = registry
    alice = tokens["alice"]
    # The launch resolves demo@1; the app stages it, then waits (it never serves).
    command = ["/bin/sh", "-c", "sleep 600", "registry:demo@1"]
    app = launch(server, alice, "http", params={"command": command})
    assert app["models"] == [{"ref": "registry:demo@1", "name": "demo", "version": 1}]
    task = wait_for(lambda: _running(server, alice, app["id"]), 60, "the app to run")
    job_dir = Path(task["job_dir"])
    staged = job_dir / "models" / "demo" / "v1" / "w.bin"
    wait_for(staged.is_file, 60, "the runner to stage demo version 1")
    assert staged.read_bytes() == b"version one"
    token = json.loads((job_dir / "task.json").read_text())["report"]["token"]
    with api(server, token) as job:
        assert job.get("/models/demo/versions/1/files/0").content == b"version one"
        for other in ("/models/demo/versions/2/files/0", "/models/secret/versions/1/files/0"):
            refused = job.get(other)
            assert refused.status_code == 404 and b"alice's" not in refused.content, other
        assert job.get("/models/demo/versions/latest").status_code == 404
        assert job.get("/models/secret/versions/1").status_code == 404
        assert (
            job.post("/models/demo/versions/1/stage", json={"stage": "production"}).status_code
            == 401
        )
    stop(server, alice, app["id"])


def _running(server: Server, token: str, task_id: int) -> dict[str, Any] | None:
    task = server.task(task_id, token)
    assert task["state"] not in ("failed", "cancelled", "lost", "completed"), task
    return task if task["state"] == "running" and task.get("job_dir") else None


@pytest.mark.parametrize("name", ["../demo", "a/b", "..", "demo..x", ".hidden", "x" * 129])
def test_a_model_name_never_reaches_a_path(registry, name: str) -> None:
    server, tokens = registry
    with api(server, tokens["alice"]) as http:
        run = run_with_artifact(http, b"w")
        body = {"name": name, "task": run, "files": [{"path": "w", "artifact": "w"}]}
        assert http.post("/models", json=body).status_code in (400, 422)
    with pytest.raises(SetupFailed):  # the runner checks task.json's names again
        StagedModel({"name": name, "version": 1, "kind": "file", "files": [_file("w")]})


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "a/../../b", ".ssh/x", "a//b"])
def test_a_model_file_never_reaches_outside_its_folder(registry, path: str) -> None:
    server, tokens = registry
    with api(server, tokens["alice"]) as http:
        run = run_with_artifact(http, b"w")
        body = {"name": "paths", "task": run, "files": [{"path": path, "artifact": "w"}]}
        assert http.post("/models", json=body).status_code == 400
    with pytest.raises(SetupFailed):
        StagedModel({"name": "paths", "version": 1, "kind": "file", "files": [_file(path)]})


def _file(path: str) -> dict[str, Any]:
    return {"path": path, "digest": "0" * 64, "size": 1}


def signed_in(server: Server, token: str) -> tuple[httpx.Client, str]:
    """A browser-like client signed in with `token`, and its CSRF token."""
    client = httpx.Client(base_url=server.url, timeout=30, follow_redirects=False)
    form = client.get("/login").text
    login_token = re.search(r'name="login_token" value="([^"]+)"', form)[1]  # type: ignore[index]
    answer = client.post("/login", data={"token": token, "login_token": login_token})
    assert answer.status_code == 303, answer.text
    page = client.get("/tasks").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)[1]  # type: ignore[index]
    return client, csrf


def test_another_team_is_refused_on_the_models_page_and_over_mcp(registry) -> None:
    server, tokens = registry
    before = stages(server, "demo")
    client, csrf = signed_in(server, tokens["bob"])
    try:
        assert "demo" not in client.get("/models").text
        assert client.get("/models/demo").status_code == 404
        posted = client.post(
            "/models/demo/versions/2/stage", data={"csrf": csrf, "stage": "production"}
        )
        assert posted.status_code == 303 and "error=" in posted.headers["location"]
    finally:
        client.close()

    async def as_bob() -> list[tuple[bool, str]]:
        async with mcp_session(server, tokens["bob"]) as session:
            return [
                await call(session, "promote_model", name="demo", version=2),
                await call(session, "show_model", name="demo"),
                await call(session, "list_models"),
            ]

    (promote_refused, promoted), (show_refused, _), (_, listed) = asyncio.run(as_bob())
    assert promote_refused and show_refused and "klique model ls" in promoted
    assert json.loads(listed) == []
    assert stages(server, "demo") == before


def test_the_models_page_shows_lineage_and_escapes_what_runs_wrote(registry) -> None:
    server, tokens = registry
    with api(server, tokens["alice"]) as http:
        run = run_with_artifact(http, b"w")
        body = {
            "name": "tagged",
            "task": run,
            "files": [{"path": "w", "artifact": "w"}],
            "tags": ["<script>alert(1)</script>"],
            "metadata": {"note": "<img src=x onerror=alert(2)>"},
        }
        assert http.post("/models", json=body).status_code == 201
    client, _ = signed_in(server, tokens["alice"])
    try:
        page = client.get("/models/tagged").text
    finally:
        client.close()
    assert f'href="/tasks/{run}"' in page  # the run that made it
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page
