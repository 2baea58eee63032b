"""The research record end to end. Automatic capture: a training script that only calls
Task.init has its argparse arguments, installed packages, git state, TensorBoard events,
matplotlib figure and resources on its record (SDK -> the runner's reporter -> the server ->
the API); a clone with an edited argument gets the edited value back from parse_args in its job.
Tags and the archive: `Task.init(tags=)`, `klique tag`, `klique ls --tag`, `klique archive`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import HOST_ACCESS_SETTINGS
from helpers.sdk import TRUST, estate, recorded_id, trusted_checkout
from helpers.web_session import signed_in

HOST_POOL = {"kind": "host", "slots": 2, **HOST_ACCESS_SETTINGS}


@pytest.fixture(scope="module")
def checkout():
    with trusted_checkout() as made:
        yield made


@pytest.fixture(scope="module")
def host(module_server_factory):
    server = module_server_factory(estate("p", HOST_POOL))
    return server, server.make_token("alice")


def run_with_frameworks(server, token, checkout, *argv: str) -> subprocess.CompletedProcess[str]:
    """The script with the tests' own interpreter, which has matplotlib and tensorboard (alice's
    system python3 has neither, and this one is not hers to run)."""
    env = {
        **TRUST,
        "PATH": os.environ["PATH"],
        "HOME": str(checkout.folder),
        "PYTHONPATH": str(checkout.sdk),
        "KLIQUE_API": server.url,
        "KLIQUE_TOKEN": token,
        "KLIQUE_MONITOR_INTERVAL_S": "0.5",
    }
    command = [sys.executable, *argv]
    return subprocess.run(
        command, cwd=checkout.repo, env=env, capture_output=True, text=True, timeout=300
    )


def test_a_script_has_its_arguments_events_figures_and_resources_captured(host, checkout):
    pytest.importorskip("tensorboard")
    pytest.importorskip("matplotlib")
    server, token = host
    done = run_with_frameworks(server, token, checkout, "capture.py", "--lr", "0.5")
    assert done.returncode == 0, done.stdout + done.stderr
    task_id = recorded_id(done.stdout)
    task = server.wait_state(task_id, token=token)
    assert task["state"] == "completed", task
    assert task["parameters"] == {"Args/lr": 0.5, "Args/epochs": 2}
    assert task["tags"] == ["capture"]
    assert any(p.startswith("tensorboard==") for p in task["packages"]), task["packages"]
    assert task["code"]["commit"] and task["code"]["repo"], task["code"]
    lines = {(s["name"], s["series"]) for s in task["scalars"]}
    assert {("loss", "train"), (":monitor:", "cpu %"), (":monitor:", "memory MiB")} <= lines
    losses = [(s["step"], s["value"]) for s in task["scalars"] if s["name"] == "loss"]
    assert losses == [(0, 0.5), (1, 0.25)]
    with server.api(token) as api:
        images = api.get(f"/tasks/{task_id}/reports", params={"kind": "image"}).json()
    assert [(i["title"], i["iteration"]) for i in images] == [("loss curve", 0)], images

    cloned = server.cli(
        "submit",
        "--clone",
        str(task_id),
        "--param",
        "Args/lr=0.01",
        "-r",
        "cpu",
        "--json",
        token=token,
    )
    assert cloned.exit_code == 0, cloned.output
    clone_id = json.loads(cloned.output)["id"]
    clone = server.wait_state(clone_id, token=token)
    logs = server.cli("logs", str(clone_id), token=token).output
    assert clone["state"] == "completed", (clone, logs)
    assert "training with lr=0.01 epochs=2" in logs, logs
    assert clone["parameters"] == {"Args/lr": 0.01, "Args/epochs": 2}
    assert clone["tags"] == ["capture"]  # Task.init(tags=) in the job, with its report token


def test_each_part_switched_off_by_its_variable_is_not_captured(host, checkout):
    server, token = host
    off = {f"KLIQUE_CAPTURE_{part}": "0" for part in ("ARGPARSE", "PACKAGES", "GIT", "MONITOR")}
    done = checkout.run(server, token, "capture.py", "--lr", "0.5", extra_env=off)
    assert done.returncode == 0, done.stdout + done.stderr
    task = server.wait_state(recorded_id(done.stdout), token=token)
    assert task["state"] == "completed", task
    assert (task["parameters"], task["packages"], task["code"]) == ({}, [], None)
    assert not [s for s in task["scalars"] if s["name"] == ":monitor:"]


def test_tags_and_the_archive_through_the_cli(host):
    server, token = host
    with server.api(token) as api:
        made = api.post(
            "/sdk/tasks", json={"command": ["python3", "t.py"], "name": "kept", "tags": ["base"]}
        )
        assert made.status_code == 201, made.text
        task_id = str(made.json()["id"])
        running = server.cli("archive", task_id, token=token)
        ended = api.post(f"/sdk/tasks/{task_id}/end", json={"outcome": "completed"})
        assert ended.status_code == 200, ended.text
    assert running.exit_code != 0 and "archive it once it has ended" in running.output

    tagged = server.cli("tag", task_id, "best", "v1.2", token=token)
    assert tagged.exit_code == 0 and "tags base,best,v1.2" in tagged.output, tagged.output
    untagged = server.cli("tag", task_id, "--remove", "v1.2", token=token)
    assert "tags base,best" in untagged.output, untagged.output
    bad = server.cli("tag", task_id, "two words", token=token)
    assert bad.exit_code != 0 and "'two words' is no tag" in bad.output, bad.output

    def listed(*args: str) -> list[int]:
        out = server.cli("ls", "--json", *args, token=token)
        assert out.exit_code == 0, out.output
        return [row["id"] for row in json.loads(out.output)]

    assert int(task_id) in listed("--tag", "best")
    assert listed("--tag", "bes") == []  # a tag, not a word in one
    archived = server.cli("archive", task_id, token=token)
    assert archived.exit_code == 0 and f"task {task_id}: archived" in archived.output
    assert int(task_id) not in listed() and listed("--archived") == [int(task_id)]
    shown = server.cli("show", task_id, token=token).output
    assert "tags:       base,best (archived)" in shown, shown
    server.cli("unarchive", task_id, token=token)
    assert int(task_id) in listed("--tag", "base")
    browser = signed_in(server, token)
    page = browser.get(f"/tasks/{task_id}").text
    tagged_list = browser.get("/tasks", params={"tag": "best"}).text
    other_list = browser.get("/tasks", params={"tag": "nobody-has-it"}).text
    browser.close()
    assert '<a class="tag" href="/tasks?tag=best">best</a>' in page
    assert f'id="task-{task_id}"' in tagged_list and f'id="task-{task_id}"' not in other_list


def test_delete_takes_the_record_its_reports_and_artifacts(host):
    server, token = host
    with server.api(token) as api:
        run = api.post("/sdk/tasks", json={"command": ["python3", "t.py"], "name": "gone"}).json()
        task_id = str(run["id"])
        put = api.put(f"/tasks/{task_id}/artifacts/weights?kind=file", content=b"only here")
        assert put.status_code == 201, put.text
        digest = put.json()["digest"]
        assert list((server.home / "artifacts").rglob(digest))  # kept, until deleted
        running = server.cli("delete", "--yes", task_id, token=token)
        assert running.exit_code != 0 and "delete it once it has ended" in running.output
        api.post(f"/sdk/tasks/{task_id}/end", json={"outcome": "completed"})
        deleted = server.cli("delete", "--yes", task_id, token=token)
        assert deleted.exit_code == 0 and f"task {task_id}: deleted" in deleted.output
        answers = [
            api.get(f"/tasks/{task_id}"),
            api.get(f"/tasks/{task_id}/reports"),
            api.get(f"/tasks/{task_id}/artifacts/weights"),
        ]
    assert [a.status_code for a in answers] == [404, 404, 404]
    assert not list((server.home / "artifacts").rglob(digest))
    usage = json.loads(server.cli("usage", "--by", "pool", "--json", token=token).output)
    assert "(local)" in [row["key"] for row in usage["rows"]]  # what ran stays accounted for
