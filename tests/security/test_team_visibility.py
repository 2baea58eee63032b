"""Attacks on runs shared with the team: a member of another team reading a run (its record,
console, scalars, reports, artifacts), a teammate acting on one (cancel, parameters, tags,
archive, artifacts, its end), and a teammate's job reading it with its report token. The team
reads; only the owner and admins act (broker/authz.py, rule 3)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from conftest import HOST_ACCESS, Server
from helpers.web_session import signed_in

ESTATE = (
    "teams:\n  vision: [alice, carol]\n  nlp: [bob]\n"
    "resources:\n  cpu:\n    profile: {cpus: 1, memory: 200M, walltime: 10m, pools: [p]}\n"
    f"pools:\n  p:\n    kind: host\n    slots: 4\n    {HOST_ACCESS}\n"
)
PNG = bytes.fromhex("89504e470d0a1a0a") + b"\x00" * 16


def api(server: Server, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def local_run(server: Server, token: str, name: str) -> dict[str, Any]:
    """A run recorded where it runs, with a console line, a scalar, a report and an artifact."""
    with api(server, token) as http:
        made = http.post("/sdk/tasks", json={"command": ["python3", "train.py"], "name": name})
        assert made.status_code == 201, made.text
        run = made.json()
        put = http.put(f"/tasks/{run['id']}/artifacts/weights?kind=file", content=b"w" * 10)
        assert put.status_code == 201, put.text
    report = {
        "console": {"offset": 0, "text": "epoch 1 done\n"},
        "scalars": [{"name": "loss", "value": 0.5, "step": 1}],
        "reports": [{"kind": "text", "title": "notes", "data": {"text": "ok", "markdown": False}}],
    }
    with api(server, run["report_token"]) as http:
        sent = http.post(f"/tasks/{run['id']}/report", json=report)
        assert sent.status_code == 200, sent.text
    return dict(run)


@pytest.fixture(scope="module")
def team(module_server_factory):
    """alice's run (team vision); carol is of vision, bob of nlp; carol has a run of her own."""
    server = module_server_factory(ESTATE)
    tokens = {user: server.make_token(user) for user in ("alice", "bob", "carol")}
    run = local_run(server, tokens["alice"], "alice-train")
    carols = local_run(server, tokens["carol"], "carol-train")
    return server, tokens, run, carols


READS = [
    "/tasks/{id}",
    "/tasks/{id}/logs",
    "/tasks/{id}/why",
    "/tasks/{id}/reports",
    "/tasks/{id}/artifacts",
    "/tasks/{id}/artifacts/weights",
    "/sdk/tasks/{id}",
]


def test_the_team_reads_a_run_and_its_console_scalars_reports_and_artifacts(team) -> None:
    server, tokens, run, _ = team
    with api(server, tokens["carol"]) as http:
        for path in READS:
            answer = http.get(path.format(id=run["id"]))
            assert answer.status_code == 200, (path, answer.text)
        record = http.get(f"/tasks/{run['id']}").json()
        logs = http.get(f"/tasks/{run['id']}/logs").json()
        listed = http.get("/tasks", params={"team": True}).json()
        own = http.get("/tasks").json()
    assert record["owner"] == "alice" and record["team"] == "vision"
    assert [s["value"] for s in record["scalars"]] == [0.5]
    assert "epoch 1 done" in logs["text"]
    assert {t["name"] for t in listed} == {"alice-train", "carol-train"}
    assert {t["name"] for t in own} == {"carol-train"}  # the default listing: her own
    browser = signed_in(server, tokens["carol"])
    page = browser.get(f"/tasks/{run['id']}")
    team_list = browser.get("/tasks", params={"team": "1"})
    browser.close()
    assert page.status_code == 200 and "epoch 1 done" in page.text
    assert "alice-train" in team_list.text


def test_another_team_still_cannot_read_a_run(team) -> None:
    server, tokens, run, _ = team
    with api(server, tokens["bob"]) as http:
        for path in READS:
            answer = http.get(path.format(id=run["id"]))
            assert answer.status_code == 404, (path, answer.status_code, answer.text)
            assert "alice" not in answer.text and "epoch" not in answer.text
        listed = http.get("/tasks", params={"team": True}).json()
    assert [t["name"] for t in listed] == []
    browser = signed_in(server, tokens["bob"])
    page = browser.get(f"/tasks/{run['id']}")
    team_list = browser.get("/tasks", params={"team": "1"})
    browser.close()
    assert page.status_code == 404 and "alice-train" not in page.text
    assert "alice-train" not in team_list.text


def test_a_teammate_cannot_cancel_edit_tag_archive_delete_or_end_a_run(team) -> None:
    server, tokens, run, _ = team
    task = f"/tasks/{run['id']}"
    sdk = f"/sdk/tasks/{run['id']}"
    with api(server, tokens["carol"]) as http:
        refused = {
            "cancel": http.post(f"{task}/cancel"),
            "sdk cancel": http.post(f"{sdk}/cancel"),
            "parameters": http.post(f"{sdk}/parameters", json={"values": {"lr": 9}}),
            "tags": http.post(f"{task}/tags", json={"add": ["mine"]}),
            "archive": http.post(f"{task}/archive"),
            "end": http.post(f"{sdk}/end", json={"outcome": "failed", "exit_code": 1}),
            "artifact": http.put(f"{task}/artifacts/weights?kind=file", content=b"evil"),
            "clone": http.post(f"{sdk}/clone", json={"resource": "cpu"}),
            "delete": http.delete(task),
        }
    for what, answer in refused.items():
        assert answer.status_code in (403, 404), (what, answer.status_code, answer.text)
    assert refused["cancel"].status_code == 403 and refused["delete"].status_code == 403
    assert "only its owner and admins may cancel it" in refused["cancel"].json()["detail"]
    with api(server, tokens["alice"]) as http:
        record = http.get(task).json()
        weights = http.get(f"{task}/artifacts/weights").content
    assert record["state"] == "running" and record["parameters"] == {}
    assert record["tags"] == [] and record["archived"] is False
    assert weights == b"w" * 10


def test_a_teammates_job_does_not_read_a_run_with_its_report_token(team) -> None:
    server, tokens, run, carols = team
    with api(server, carols["report_token"]) as http:
        for path in ("/sdk/tasks/{id}", "/tasks/{id}/artifacts", "/tasks/{id}/artifacts/weights"):
            answer = http.get(path.format(id=run["id"]))
            assert answer.status_code in (401, 404), (path, answer.status_code)
        # Nor does a job delete or archive even its own task: its owner does.
        own = [http.delete(f"/tasks/{carols['id']}"), http.post(f"/tasks/{carols['id']}/archive")]
    assert [a.status_code for a in own] == [400, 400], [a.text for a in own]
    assert server.task(carols["id"], tokens["carol"])["archived"] is False
