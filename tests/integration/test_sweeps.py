"""Sweeps and batches end to end: many tasks made in one request (all or none), a sweep from a
JSON-lines file or a grid through `klique submit`, listed and cancelled by its sweep id; a sweep
on the real Slurm pool. tests/security/test_sweeps.py keeps other users out of them."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    HOST_ESTATE,
    TASK_PY,
    Server,
    shared_folder,
    start_server,
    stop_server,
    wait_for,
)
from helpers.batch import open_folder, pool_yaml, remove_tree

ESTATE = HOST_ESTATE + "limits: {max_batch: 30}\n"
PRINT_LR = [TASK_PY, "-c", "import sys; print('lr=' + sys.argv[1])", "{lr}"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the module; tasks run as alice and bob."""
    home = tmp_path_factory.mktemp("sweeps")
    job_root = shared_folder("klique-sweeps-")
    estate = home / "estate.yaml"
    estate.write_text(ESTATE.replace("$JOB_ROOT", str(job_root)))
    started = start_server(home / "home", estate)
    yield started
    stop_server(started)
    shutil.rmtree(job_root, ignore_errors=True)


@pytest.fixture(scope="module")
def tokens(server: Server) -> dict[str, str]:
    return {user: server.make_token(user) for user in ("alice", "bob")}


def item(*command: str, **fields: Any) -> dict[str, Any]:
    return {"command": list(command), "resource": "cpu", **fields}


def task_count(server: Server, token: str) -> int:
    with server.api(token) as api:
        return len(api.get("/tasks", params={"limit": 1000}).json())


def test_a_batch_makes_every_task_in_one_request(server, tokens):
    body = {"tasks": [item(TASK_PY, "-c", f"print({n})", parameters={"n": n}) for n in range(3)]}
    with server.api(tokens["alice"]) as api:
        answer = api.post("/tasks/batch", json=body)
    assert answer.status_code == 201, answer.text
    made = answer.json()
    assert made["sweep"] is None and len(made["tasks"]) == 3
    assert [t["parameters"] for t in made["tasks"]] == [{"n": 0}, {"n": 1}, {"n": 2}]
    for task in made["tasks"]:
        done = server.wait_state(task["id"], token=tokens["alice"])
        assert (done["state"], done["owner"]) == ("completed", "alice")


def test_one_bad_item_makes_no_task_and_the_error_names_it(server, tokens):
    token = tokens["alice"]
    before = task_count(server, token)
    good = item(TASK_PY, "-c", "pass")
    with server.api(token) as api:
        unknown = api.post("/tasks/batch", json={"tasks": [good, good, item("x", resource="gpu")]})
        empty = api.post("/sweeps", json={"tasks": [good, {"command": []}]})
        owner = api.post("/tasks/batch", json={"tasks": [dict(good, owner="bob")]})
        too_many = api.post("/sweeps", json={"tasks": [good] * 31})
    assert unknown.status_code == 404
    assert "no task was made" in unknown.text and "tasks[2].resource" in unknown.text
    assert "unknown compute resource 'gpu'" in unknown.text
    assert empty.status_code == 422
    assert ["body", "tasks", 1, "command"] in [e["loc"] for e in empty.json()["detail"]]
    assert owner.status_code == 422  # the owner is the caller, never a field
    assert too_many.status_code == 413
    assert "at most 30 tasks" in too_many.text and "limits.max_batch" in too_many.text
    assert task_count(server, token) == before


def test_a_sweep_file_through_the_cli_fills_each_argument(server, tokens, tmp_path):
    params = tmp_path / "params.jsonl"
    params.write_text('{"lr": 0.1}\n\n{"lr": "a b; rm -rf /"}\n{"lr": 3}\n')
    token = tokens["alice"]
    result = server.cli(
        "submit",
        "--no-code",
        "--json",
        "--sweep",
        str(params),
        "-n",
        "lr {lr}",
        "--",
        *PRINT_LR,
        token=token,
    )
    assert result.exit_code == 0, result.output
    made = json.loads(result.output)
    sweep = made["sweep"]
    assert [t["command"][-1] for t in made["tasks"]] == ["0.1", "a b; rm -rf /", "3"]
    assert [t["name"] for t in made["tasks"]] == ["lr 0.1", "lr a b; rm -rf /", "lr 3"]
    listed = server.cli("ls", "--sweep", str(sweep), "--json", token=token)
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)
    assert sorted(t["id"] for t in rows) == sorted(t["id"] for t in made["tasks"])
    assert {t["sweep"] for t in rows} == {sweep}
    for task in made["tasks"]:
        assert server.wait_state(task["id"], token=token)["state"] == "completed"
    logs = server.cli("logs", str(made["tasks"][1]["id"]), token=token)
    assert logs.output == "lr=a b; rm -rf /\n"  # one argument, never a shell's words
    shown = server.cli("show", str(made["tasks"][1]["id"]), token=token).output
    assert f"sweep:      {sweep} (klique ls --sweep {sweep})" in shown
    assert 'lr = "a b; rm -rf /"' in shown


def test_a_missing_key_names_its_line_and_makes_nothing(server, tokens, tmp_path):
    params = tmp_path / "params.jsonl"
    params.write_text('{"lr": 0.1}\n{"rate": 0.2}\n')
    token = tokens["alice"]
    before = task_count(server, token)
    result = server.cli("submit", "--no-code", "--sweep", str(params), "--", *PRINT_LR, token=token)
    assert result.exit_code != 0
    assert f"line 2 of {params} has no key 'lr'" in result.output
    assert task_count(server, token) == before


def test_a_grid_makes_every_combination(server, tokens):
    result = server.cli(
        "submit",
        "--no-code",
        "--json",
        "--grid",
        "lr=0.1,0.01",
        "--grid",
        "bs=32,64",
        "--",
        TASK_PY,
        "-c",
        "pass",
        "{lr}",
        "{bs}",
        token=tokens["alice"],
    )
    assert result.exit_code == 0, result.output
    made = json.loads(result.output)
    assert [t["command"][-2:] for t in made["tasks"]] == [
        ["0.1", "32"],
        ["0.1", "64"],
        ["0.01", "32"],
        ["0.01", "64"],
    ]
    assert made["tasks"][1]["parameters"] == {"lr": 0.1, "bs": 64}


def test_cancel_sweep_ends_its_running_and_queued_tasks(server, tokens):
    alice = tokens["alice"]
    body = {"name": "long", "tasks": [item(TASK_PY, "-c", "import time; time.sleep(300)")] * 6}
    with server.api(alice) as api:
        made = api.post("/sweeps", json=body).json()
    sweep, ids = made["sweep"], [t["id"] for t in made["tasks"]]
    wait_for(
        lambda: sum(server.task(i, alice)["state"] == "running" for i in ids) == 4,
        60,
        "four of the sweep's tasks to run (the pool has four slots)",
    )
    assert {server.task(i, alice)["state"] for i in ids} == {"running", "queued"}
    result = server.cli("cancel", "--sweep", str(sweep), token=alice)
    assert result.exit_code == 0, result.output
    for task_id in ids:
        assert server.wait_state(task_id, token=alice)["state"] == "cancelled"
    with server.api(alice) as api:
        assert api.get(f"/sweeps/{sweep}").json()["states"] == {"cancelled": 6}


@pytest.fixture
def slurm(server_factory, slurm_cluster) -> Iterator[Server]:
    job_root = open_folder(slurm_cluster.work / f"sweep-{uuid.uuid4().hex[:8]}")
    profile = "cpus: 1, memory: 100M, walltime: 10m, pools: [batch]"
    estate = f"resources:\n  cpu: {{profile: {{{profile}}}}}\npools:\n" + pool_yaml(
        "slurm", job_root, None
    )
    yield server_factory(estate)
    remove_tree(job_root)


@pytest.mark.slurm
def test_a_sweep_of_twenty_tasks_completes_on_the_slurm_pool(slurm: Server, tmp_path: Path):
    token = slurm.make_token("alice")
    params = tmp_path / "params.jsonl"
    params.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(20)))
    result = slurm.cli(
        "submit",
        "--no-code",
        "-r",
        "cpu",
        "--sweep",
        str(params),
        "--wait",
        "--",
        TASK_PY,
        "-c",
        "print({i})",
        token=token,
    )
    assert result.exit_code == 0, result.output
    assert "20 tasks queued" in result.output and "20 completed" in result.output
    sweep = result.output.split(":", 1)[0].removeprefix("sweep ")
    rows = json.loads(slurm.cli("ls", "--sweep", sweep, "--json", token=token).output)
    assert [r["state"] for r in rows] == ["completed"] * 20
    assert {r["pool"] for r in rows} == {"batch"}


def test_the_sdk_makes_a_sweep_and_cancels_it(server, tokens, monkeypatch):
    import klique

    monkeypatch.setenv("KLIQUE_API", server.url)
    monkeypatch.setenv("KLIQUE_TOKEN", tokens["alice"])
    runs = [
        {"command": [TASK_PY, "-c", "import time; time.sleep(300)", f"--lr={lr}"],
         "parameters": {"lr": lr}}
        for lr in (0.1, 0.01)
    ]  # fmt: skip
    made = klique.sweep(runs, resource="cpu", name="sdk")
    assert len(made.task_ids) == 2
    tasks = [server.task(i, tokens["alice"]) for i in made.task_ids]
    assert [(t["sweep"], t["parameters"]) for t in tasks] == [
        (made.id, {"lr": 0.1}),
        (made.id, {"lr": 0.01}),
    ]
    assert sum(made.states().values()) == 2
    made.cancel()
    for task_id in made.task_ids:
        assert server.wait_state(task_id, token=tokens["alice"])["state"] == "cancelled"
    with pytest.raises(klique.KliqueError, match="run 0 needs a command"):
        klique.sweep([{"argv": ["true"]}])
