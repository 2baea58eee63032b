"""The SDK end to end, as alice on a login node: a run recorded where it runs, sent to a
compute resource, cloned with edited parameters; pipelines whose steps run on their compute
resources on the host pool and on the real Slurm pool."""

from __future__ import annotations

import json
import pickle
import uuid

import pytest
from conftest import HOST_ACCESS_SETTINGS, wait_for
from helpers.batch import batch_pool, open_folder, remove_tree
from helpers.sdk import estate, last_json, recorded_id, trusted_checkout

HOST_POOL = {"kind": "host", "slots": 4, "gpus": 2, **HOST_ACCESS_SETTINGS}


@pytest.fixture
def checkout():
    with trusted_checkout() as made:
        yield made


@pytest.fixture
def host(server_factory):
    server = server_factory(estate("p", HOST_POOL))
    return server, server.make_token("alice")


@pytest.fixture
def slurm(server_factory, slurm_cluster):
    job_root = open_folder(slurm_cluster.work / f"sdk-{uuid.uuid4().hex[:8]}")
    server = server_factory(estate("batch", batch_pool("slurm", job_root, None)))
    yield server, server.make_token("alice")
    remove_tree(job_root)


def artifact(server, token, task_id, name):
    """An artifact's content as `klique artifacts get` writes it."""
    with server.api(token) as api:
        answer = api.get(f"/tasks/{task_id}/artifacts/{name}")
    assert answer.status_code == 200, answer.text
    return answer.content


def test_a_run_here_is_recorded_with_its_code_packages_console_scalars_and_artifacts(
    host, checkout
):
    server, token = host
    done = checkout.run(server, token, "track.py")
    assert done.returncode == 0, done.stdout + done.stderr
    task_id = recorded_id(done.stdout)
    task = server.wait_state(task_id, token=token)
    assert (task["state"], task["origin"], task["pool"]) == ("completed", "local", "(local)")
    assert task["owner"] == "alice" and task["project"] == "AI Engineering"
    assert task["code"]["repo"] == str(checkout.repo) and task["command"] == ["python3", "track.py"]
    assert task["parameters"] == {"lr": 0.1, "epochs": 3}
    assert [s["value"] for s in task["scalars"]] == [0.1, 0.05, 0.1 / 3]
    assert {a["name"]: a["kind"] for a in task["artifacts"]} == {
        "weights": "file",
        "summary": "object",
    }
    assert artifact(server, token, task_id, "weights") == bytes(range(256)) * 4
    assert any(p.startswith("pip==") or "==" in p for p in task["packages"])
    logs = server.cli("logs", str(task_id), token=token).output
    assert "running as alice in task None" in logs, logs
    listed = server.cli("ls", "--json", token=token).output
    assert json.loads(listed)[0]["pool"] == "(local)"
    usage = json.loads(server.cli("usage", "--by", "pool", "--json", token=token).output)
    assert [row["key"] for row in usage["rows"]] == ["(local)"]


def test_execute_remotely_runs_the_same_task_on_the_resource_and_a_clone_takes_new_values(
    host, checkout, tmp_path
):
    server, token = host
    done = checkout.run(server, token, "track.py", "--remote", "cpu")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "queued on cpu" in done.stdout
    task_id = recorded_id(done.stdout)
    task = server.wait_state(task_id, token=token)
    logs = server.cli("logs", str(task_id), token=token).output
    assert task["state"] == "completed", (task, logs)
    assert (task["origin"], task["pool"], task["resource"]) == ("pool", "p", "cpu")
    assert f"running as alice in task {task_id}" in logs, logs
    moves = [(e["from"], e["to"]) for e in task["events"]]
    assert moves[:2] == [("created", "running"), ("running", "queued")], moves
    assert [s["value"] for s in task["scalars"]] == [0.1, 0.05, 0.1 / 3]
    usage = json.loads(server.cli("usage", "--by", "pool", "--json", token=token).output)
    assert sorted(row["key"] for row in usage["rows"]) == ["(local)", "p"]
    got = server.cli("artifacts", "get", str(task_id), "weights", "-o", str(tmp_path / "w"))
    assert got.exit_code == 0, got.output
    assert (tmp_path / "w").read_bytes() == bytes(range(256)) * 4

    cloned = server.cli(
        "submit", "--clone", str(task_id), "--param", "lr=0.01", "--json", token=token
    )
    assert cloned.exit_code == 0, cloned.output
    clone_id = json.loads(cloned.output)["id"]
    clone = server.wait_state(clone_id, token=token)
    assert clone["state"] == "completed", clone
    assert clone["parameters"] == {"lr": 0.01, "epochs": 3}
    assert [s["value"] for s in clone["scalars"]] == [0.01, 0.005, 0.01 / 3]
    compared = json.loads(
        server.cli("compare", str(task_id), str(clone_id), "--json", token=token).output
    )
    rows = {row["what"]: row for row in compared["rows"]}
    assert rows["param lr"][str(task_id)] == 0.1 and rows["param lr"][str(clone_id)] == 0.01
    assert rows["last loss"][str(clone_id)] == pytest.approx(0.01 / 3)


def run_three_steps(server, token, checkout, pool: str) -> None:
    done = checkout.run(server, token, "three_steps.py", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    pipeline_id = recorded_id(done.stdout)
    result = last_json(done.stdout)["result"]
    pipeline = server.task(pipeline_id, token)
    assert pipeline["state"] == "completed" and pipeline["origin"] == "local", pipeline
    with server.api(token) as api:
        steps = api.get(f"/sdk/tasks/{pipeline_id}/steps").json()
    assert [s["name"] for s in steps] == ["prepare", "train", "evaluate"]
    by_name = {s["name"]: server.task(s["id"], token) for s in steps}
    for name, resource in (("prepare", "cpu"), ("train", "1-gpu"), ("evaluate", "half-gpu")):
        step = by_name[name]
        assert (step["state"], step["resource"], step["pool"]) == ("completed", resource, pool)
        assert step["owner"] == "alice" and step["parent"] == pipeline_id
        assert result["ran"][name] == {
            "user": "alice",
            "task": str(step["id"]),
            "gpus": result["ran"][name]["gpus"],
        }
    assert result["ran"]["prepare"]["gpus"] == ""
    assert result["ran"]["train"]["gpus"] != "" and result["ran"]["evaluate"]["gpus"] != ""
    assert result["model"] == "sum=14 rows=4\n"  # 0 + 1 + 4 + 9, computed from the file
    assert pickle.loads(artifact(server, token, pipeline_id, "result")) == result
    read = checkout.run(
        server,
        token,
        "-c",
        "import json, klique; "
        f"print(json.dumps(klique.Task.get({by_name['evaluate']['id']}).artifacts['result'].get()))",
    )
    assert json.loads(read.stdout) == result, read.stdout + read.stderr
    shown = server.cli("show", str(pipeline_id), token=token).output
    train = by_name["train"]["id"]
    assert f"[{train}] train: done on 1-gpu @ {pool}  <- prepare [{steps[0]['id']}]" in shown


def test_a_three_step_pipeline_on_the_host_pool(host, checkout):
    run_three_steps(*host, checkout, "p")


@pytest.mark.slurm
def test_a_three_step_pipeline_on_the_slurm_pool(slurm, checkout):
    run_three_steps(*slurm, checkout, "batch")


def test_a_pipeline_controller_runs_as_a_task_on_the_estates_pipeline_resource(host, checkout):
    server, token = host
    done = checkout.run(server, token, "three_steps.py", "--remote")
    assert done.returncode == 0, done.stdout + done.stderr
    pipeline_id = last_json(done.stdout)["pipeline"]
    pipeline = server.wait_state(pipeline_id, token=token, timeout=300)
    logs = server.cli("logs", str(pipeline_id), token=token).output
    assert pipeline["state"] == "completed", (pipeline, logs)
    assert (pipeline["resource"], pipeline["parameters"]) == ("cpu", {"rows": 5})
    with server.api(token) as api:
        steps = api.get(f"/sdk/tasks/{pipeline_id}/steps").json()
    assert [(s["name"], s["state"]) for s in steps] == [
        ("prepare", "completed"),
        ("train", "completed"),
        ("evaluate", "completed"),
    ]
    names = [a["name"] for a in pipeline["artifacts"]]
    assert "result" in names, pipeline


def test_a_cached_step_reuses_the_outputs_of_the_same_code_and_inputs(host, checkout):
    server, token = host
    first = checkout.run(server, token, "steps_more.py", "cached")
    second = checkout.run(server, token, "steps_more.py", "cached")
    assert first.returncode == 0 and second.returncode == 0, first.stdout + second.stdout
    assert first.stdout.splitlines()[-1] == second.stdout.splitlines()[-1] == "10"
    with server.api(token) as api:
        steps = api.get(f"/sdk/tasks/{recorded_id(second.stdout)}/steps").json()
        earlier = api.get(f"/sdk/tasks/{recorded_id(first.stdout)}/steps").json()
    square = steps[0]
    assert (square["name"], square["origin"], square["state"]) == ("square", "cached", "completed")
    assert (
        square["reason"] == f"reused the outputs of task {earlier[0]['id']} (same code and inputs)"
    )
    assert steps[1]["origin"] == "pool"  # add is not cached: it ran again
    first_square = artifact(server, token, earlier[0]["id"], "result")
    assert artifact(server, token, square["id"], "result") == first_square


def test_steps_that_are_ready_together_are_queued_in_one_request(host, checkout):
    server, token = host
    done = checkout.run(server, token, "steps_more.py", "fan-out", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "30"  # 2 * (0 + 1 + ... + 5)
    with server.api(token) as api:
        steps = api.get(f"/sdk/tasks/{recorded_id(done.stdout)}/steps").json()
    shown = [server.task(s["id"], token) for s in steps]
    assert [s["name"] for s in shown] == ["double"] * 6 + ["total"]
    assert all(s["state"] == "completed" for s in shown), shown
    # One request, one transaction: the six ready steps were made at one instant.
    assert len({s["created_at"] for s in shown[:6]}) == 1, shown
    assert shown[6]["created_at"] > shown[0]["created_at"]


def test_a_failed_step_fails_the_pipeline_with_its_reason(host, checkout):
    server, token = host
    done = checkout.run(server, token, "steps_more.py", "failing")
    assert done.returncode != 0
    pipeline_id = recorded_id(done.stdout)
    pipeline = server.wait_state(pipeline_id, token=token)
    with server.api(token) as api:
        steps = api.get(f"/sdk/tasks/{pipeline_id}/steps").json()
    assert [s["name"] for s in steps] == ["explode"]  # nothing after it was started
    assert pipeline["state"] == "failed", pipeline
    expected = (
        f"step explode (task {steps[0]['id']}) failed: exited with code 1: ValueError: bad batch 7"
    )
    assert expected in pipeline["reason"], pipeline


def test_cancelling_a_pipeline_cancels_its_running_steps(host, checkout):
    server, token = host
    controller = checkout.run(server, token, "steps_more.py", "long", background=True)
    try:
        with server.api(token) as api:

            def step_running():
                listed = api.get("/tasks", params={"limit": 5}).json()
                pipelines = [t for t in listed if t["name"] == "long"]
                if not pipelines:
                    return None
                steps = api.get(f"/sdk/tasks/{pipelines[0]['id']}/steps").json()
                running = steps and steps[0]["state"] == "running"
                return (pipelines[0]["id"], steps[0]["id"]) if running else None

            pipeline_id, step_id = wait_for(step_running, 60, "the step to run")
        cancelled = server.cli("cancel", str(pipeline_id), token=token)
        assert cancelled.exit_code == 0, cancelled.output
        step = server.wait_state(step_id, token=token)
        assert step["state"] == "cancelled", (step["reason"], step["events"])
        output, _ = controller.communicate(timeout=60)
        assert controller.returncode != 0 and f"pipeline {pipeline_id} was cancelled" in output
        assert server.task(pipeline_id, token)["state"] == "cancelled"
    finally:
        if controller.poll() is None:
            controller.kill()
