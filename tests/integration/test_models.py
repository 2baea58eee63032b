"""The model registry end to end on the host pool and on the real Slurm pool: a run registers
versions of a model, one is promoted, an `http` endpoint launched with `registry:demo@production`
behind a static route serves that version's file; after the next promotion a relaunch serves the
new one behind the same route, with no change on the client's side."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest
from conftest import HOST_ACCESS, TASK_PY, wait_for
from helpers.app import call, launch, mcp_session, stop, wait_ready
from helpers.batch import open_folder, pool_yaml, remove_tree
from helpers.sdk import last_json, recorded_id, trusted_checkout

TEAMS = "teams:\n  vision: [alice]\n  nlp: [bob]\n"
RESOURCE = "resources:\n  cpu:\n    profile: {cpus: 1, memory: 1G, walltime: 1h, pools: [p]}\n"
# Serves the content of the file its second argument names (the model, staged by the runner).
SERVE = """
import http.server, sys
port, path = int(sys.argv[1]), sys.argv[2]
class Serve(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(path, "rb") as f:
            body = f.read()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Serve).serve_forever()
"""


@pytest.fixture(params=["host", pytest.param("slurm", marks=pytest.mark.slurm)])
def server(request, server_factory):
    """A server whose one pool `p` is a host pool, or the real Slurm cluster's."""
    if request.param == "host":
        yield server_factory(
            TEAMS + RESOURCE + f"pools:\n  p:\n    kind: host\n    slots: 4\n    {HOST_ACCESS}\n"
        )
        return
    cluster = request.getfixturevalue("slurm_cluster")
    job_root = open_folder(cluster.work / f"models-{uuid.uuid4().hex[:8]}")
    pool = pool_yaml("slurm", job_root, None, uv="stage").replace("  batch:", "  p:")
    yield server_factory(TEAMS + RESOURCE + "pools:\n" + pool)
    remove_tree(job_root)


@pytest.fixture
def checkout():
    with trusted_checkout() as made:
        yield made


def register(server, token, checkout, *texts):
    done = checkout.run(server, token, "register_model.py", *texts)
    assert done.returncode == 0, done.stdout + done.stderr
    out = last_json(done.stdout)
    assert out["read_back"] == texts[-1]
    return recorded_id(done.stdout), out["versions"]


def served(server, token):
    answer = httpx.get(
        f"{server.routes_url}/routes/served/",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    return answer.text if answer.status_code == 200 else f"HTTP {answer.status_code}"


def promote_over_mcp(server, token, version):
    async def promote():
        async with mcp_session(server, token) as session:
            return await call(session, "promote_model", name="demo", version=version)

    refused, text = asyncio.run(promote())
    assert not refused and json.loads(text)["stage"] == "production", text


def test_an_endpoint_serves_the_promoted_version_and_a_relaunch_the_next(
    server, checkout, tmp_path
):
    alice = server.make_token("alice")
    run, versions = register(server, alice, checkout, "weights one", "weights two")
    assert versions == [1, 2]
    promoted = server.cli("model", "promote", "demo", "2", token=alice)
    assert promoted.exit_code == 0, promoted.output
    listed = server.cli("model", "ls", "--json", token=alice)
    assert '"production": 2' in listed.output, listed.output
    with server.api() as api:
        made = api.post("/routes", json={"name": "served", "teams": ["vision"], "apps": ["http"]})
        assert made.status_code == 201, made.text

    command = [TASK_PY, "-c", SERVE, "{port}", "registry:demo@production"]
    first = launch(server, alice, "http", route="served", params={"command": command})
    assert first["models"] == [{"ref": "registry:demo@production", "name": "demo", "version": 2}]
    wait_ready(server, alice, first["id"])
    assert served(server, alice) == "weights two"

    # The next version is made in a job on the pool, with the job's report token.
    sent = checkout.run(server, alice, "register_model.py", "--remote", "cpu", "weights three")
    assert sent.returncode == 0, sent.stdout + sent.stderr
    job = server.wait_state(recorded_id(sent.stdout), timeout=180, token=alice)
    console = server.cli("logs", str(job["id"]), token=alice).output
    assert job["state"] == "completed", console
    assert last_json(console) == {"versions": [3], "read_back": "weights three"}
    promote_over_mcp(server, alice, 3)
    with server.api(alice) as api:
        again = api.post(f"/sdk/tasks/{first['id']}/clone", json={})
        assert again.status_code == 201, again.text
        second = api.get(f"/apps/instances/{again.json()['id']}").json()
        shown = api.get("/models/demo").json()
    assert second["models"][0]["version"] == 3 and second["route"] == "served"
    wait_ready(server, alice, second["id"])
    stop(server, alice, first["id"])
    wait_for(lambda: served(server, alice) == "weights three", 30, "the new version to serve")

    stages = {v["version"]: v["stage"] for v in shown["versions"]}
    assert stages == {1: "none", 2: "archived", 3: "production"}
    assert shown["versions"][0]["task_id"] == run and shown["team"] == "vision"
    assert shown["versions"][2]["task_id"] == job["id"]
    assert {(s["id"], s["version"]) for s in shown["serving"]} >= {(second["id"], 3)}
    shown_cli = server.cli("model", "show", "demo", token=alice)
    assert f"served by app {second['id']}" in shown_cli.output, shown_cli.output
    fetched = server.cli(
        "model", "download", "demo", "--stage", "production", "-o", str(tmp_path / "d"), token=alice
    )
    assert fetched.exit_code == 0, fetched.output
    assert (tmp_path / "d" / "weights.txt").read_text() == "weights three"
    stop(server, alice, second["id"])


def test_a_version_keeps_the_runs_last_scalars_and_its_own_metadata(server_factory):
    server = server_factory(
        TEAMS + RESOURCE + f"pools:\n  p:\n    kind: host\n    slots: 1\n    {HOST_ACCESS}\n"
    )
    alice = server.make_token("alice")
    with server.api(alice) as api:
        run = api.post("/sdk/tasks", json={"command": ["python3", "train.py"], "name": "t"}).json()
        scalars = [
            {"name": "loss", "value": 0.9, "step": 1},
            {"name": "loss", "value": 0.25, "step": 2},
            {"name": "acc", "series": "val", "value": 0.8},
        ]
        with httpx.Client(base_url=server.url + "/api/v1", timeout=30) as job:
            reported = job.post(
                f"/tasks/{run['id']}/report",
                json={"scalars": scalars},
                headers={"Authorization": f"Bearer {run['report_token']}"},
            )
            assert reported.status_code < 300, reported.text
        assert api.put(f"/tasks/{run['id']}/artifacts/w?kind=file", content=b"w").status_code == 201
        body = {
            "name": "scored",
            "task": run["id"],
            "files": [{"path": "w.bin", "artifact": "w"}],
            "framework": "pytorch",
            "metadata": {"classes": 10},
            "tags": ["baseline"],
        }
        made = api.post("/models", json=body)
        assert made.status_code == 201, made.text
        later = api.post("/models", json={**body, "kind": "folder"}).json()
    version = made.json()
    assert version["metrics"] == {"loss": 0.25, "acc/val": 0.8}
    assert (version["version"], version["stage"], later["version"]) == (1, "none", 2)
    assert (version["framework"], version["metadata"], version["tags"]) == (
        "pytorch",
        {"classes": 10},
        ["baseline"],
    )
    shown = server.cli("model", "show", "scored", token=alice)
    assert "loss=0.25" in shown.output and "pytorch" in shown.output, shown.output
