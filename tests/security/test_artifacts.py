"""Artifacts are the owner's: another user can neither list, read nor write them, and a task's
report token reaches its own task's only. Uploads have a size limit (a clear 413, nothing
kept); names never become paths."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from conftest import HOST_ACCESS

from .conftest import RESOURCE, Attack, submit

LIMITED = (
    RESOURCE
    + f"pools:\n  p:\n    kind: host\n    slots: 2\n    {HOST_ACCESS}\n"
    + "limits: {max_request: 1M}\nartifacts: {max_size: 2M}\n"
)


def local_task(api: httpx.Client) -> int:
    """A run recorded by the SDK where it runs (no pool involved)."""
    answer = api.post("/sdk/tasks", json={"command": ["python3", "train.py"], "name": "mine"})
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


def put(api: httpx.Client, task_id: int, name: str, data: bytes, **params: str) -> httpx.Response:
    return api.put(f"/tasks/{task_id}/artifacts/{name}", content=data, params=params)


def test_another_users_artifacts_are_invisible_and_undownloadable(attack_factory) -> None:
    attack: Attack = attack_factory("host")
    server = attack.server
    with server.api(attack.alice) as alice, server.api(attack.bob) as bob:
        task_id = local_task(alice)
        assert put(alice, task_id, "model", b"alice's weights").status_code == 201
        assert bob.get(f"/tasks/{task_id}/artifacts").status_code == 404
        assert bob.get(f"/tasks/{task_id}/artifacts/model").status_code == 404
        assert put(bob, task_id, "model", b"bob's forgery").status_code == 404
        assert bob.get(f"/sdk/tasks/{task_id}").status_code == 404
        assert (
            bob.post(f"/sdk/tasks/{task_id}/parameters", json={"values": {"a": 1}}).status_code
            == 404
        )
        as_input = {
            "command": ["true"],
            "resource": "cpu",
            "inputs": [{"task": task_id, "name": "model"}],
        }
        assert bob.post("/sdk/tasks", json=as_input).status_code == 404
        assert alice.get(f"/tasks/{task_id}/artifacts/model").content == b"alice's weights"
    listed = server.cli("artifacts", str(task_id), token=attack.bob)
    assert listed.exit_code != 0 and "no task" in listed.output
    with server.api() as admin:  # admins may read everyone's
        assert admin.get(f"/tasks/{task_id}/artifacts/model").content == b"alice's weights"


def test_a_report_token_uploads_to_its_own_task_only(attack_factory) -> None:
    attack: Attack = attack_factory("host")
    server = attack.server
    with server.api(attack.alice) as alice:
        alices = local_task(alice)
        assert put(alice, alices, "model", b"alice's weights").status_code == 201
    bobs = submit(attack, attack.bob, "sleep 600")
    bob_task = server.wait_state(bobs, {"running"}, token=attack.bob)
    # bob's job reads its own report token from its task.json, as any job can.
    token = json.loads((Path(bob_task["job_dir"]) / "task.json").read_text())["report"]["token"]
    with httpx.Client(
        base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {token}"}
    ) as job:
        assert put(job, alices, "model", b"forged").status_code == 404
        assert put(job, alices, "other", b"forged").status_code == 404
        assert job.get(f"/tasks/{alices}/artifacts/model").status_code == 404
        assert (
            job.post(
                "/sdk/tasks", json={"command": ["true"], "resource": "cpu", "parent": alices}
            ).status_code
            == 404
        )
        assert put(job, bobs, "out", b"bob's own").status_code == 201
    with server.api(attack.alice) as alice:
        assert alice.get(f"/tasks/{alices}/artifacts/model").content == b"alice's weights"
        assert [a["name"] for a in alice.get(f"/tasks/{alices}/artifacts").json()] == ["model"]
    server.cli("cancel", str(bobs), token=attack.bob)
    server.wait_state(bobs, token=attack.bob)
    with httpx.Client(
        base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {token}"}
    ) as job:
        late = put(job, bobs, "late", b"after the end")
        assert late.status_code == 409 and "has ended" in late.json()["detail"]


def test_an_artifact_over_the_size_limit_is_refused_with_the_limit_and_the_fix(
    server_factory,
) -> None:
    server = server_factory(LIMITED)
    store = server.home / "artifacts"
    with server.api() as api:
        task_id = local_task(api)
        # Over the request limit (1M) but within the artifacts' (2M): uploads stream past it.
        fits = put(api, task_id, "fits", b"x" * (3 << 19))
        assert fits.status_code == 201, fits.text
        declared = put(api, task_id, "big", b"x" * (3 << 20))
        assert declared.status_code == 413
        assert "limit of 2097152 bytes" in declared.json()["detail"]
        assert "artifacts.max_size" in declared.json()["detail"]
        try:
            streamed = api.put(
                f"/tasks/{task_id}/artifacts/big", content=iter([b"x" * (1 << 20)] * 3)
            )
            assert streamed.status_code == 413 and "artifacts.max_size" in streamed.text
        except httpx.TransportError:
            pass  # the server may close the connection while the rest is still being sent
        assert [a["name"] for a in api.get(f"/tasks/{task_id}/artifacts").json()] == ["fits"]
    assert list((store / "tmp").iterdir()) == []  # nothing of the refused uploads is kept
    assert len(list((store / "sha256").rglob("*"))) == 2  # one folder, one file


@pytest.fixture(scope="module")
def limited(module_server_factory):
    """One server for the names below: each refused upload must leave its store empty."""
    return module_server_factory(LIMITED)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("..", {}),
        ("%2E%2E", {}),
        ("..%2Fescape", {}),
        ("a%2Fb", {}),
        (".hidden", {}),
        ("new%0Aline", {}),
        ("ok", {"filename": "../../etc/passwd"}),
        ("ok", {"filename": "a/b"}),
        ("ok", {"filename": ".."}),
        ("ok", {"kind": "script"}),
    ],
)
def test_artifact_names_that_try_path_traversal_are_refused(limited, name, params) -> None:
    server = limited
    with server.api() as api:
        task_id = local_task(api)
        answer = api.put(f"/tasks/{task_id}/artifacts/{name}", content=b"data", params=params)
        # 405: the client resolved the dots itself and named the task, not an artifact.
        assert answer.status_code in (404, 405, 422), answer.text
        assert api.get(f"/tasks/{task_id}/artifacts").json() == []
    store = server.home / "artifacts"
    assert sorted(p.name for p in store.iterdir()) == ["tmp"]  # nothing written anywhere
