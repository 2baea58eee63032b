"""ClearML's PipelineController on the host pool, as alice: a clone of an earlier task as a
step (add_step with parameter_override) whose artifact a function step reads through
Task.get_task(${STEP.id}); and a controller sent to a compute resource with start(queue=),
the local process ending there as ClearML's does."""

from __future__ import annotations

import pickle

import pytest
from conftest import HOST_ACCESS_SETTINGS
from helpers.estates import estate_yaml, profile
from helpers.sdk import recorded_id, trusted_checkout

HOST_POOL = {"kind": "host", "slots": 4, "gpus": 2, **HOST_ACCESS_SETTINGS}


@pytest.fixture
def checkout():
    with trusted_checkout() as made:
        yield made


@pytest.fixture
def host(server_factory):
    allocation = {"cpus": 1, "memory": "200M", "walltime": "10m"}
    server = server_factory(
        estate_yaml(
            resources={
                "cpu": profile("p", **allocation),
                "gpu": profile("p", gpus=1, **allocation),
            },
            pools={"p": HOST_POOL},
        )
    )
    return server, server.make_token("alice")


def test_a_clone_step_and_a_queued_controller(host, checkout) -> None:
    server, token = host
    queued = checkout.run(server, token, "clearml_controller.py", "queued", background=True)
    base = checkout.run(server, token, "clearml_base.py")
    assert base.returncode == 0, base.stdout + base.stderr
    base_id = recorded_id(base.stdout)
    assert server.wait_state(base_id, token=token, timeout=120)["state"] == "completed"

    cloned = checkout.run(server, token, "clearml_controller.py", "clone", str(base_id))
    assert cloned.returncode == 0, cloned.stdout + cloned.stderr
    pipeline_id = recorded_id(cloned.stdout)
    with server.api(token) as api:
        steps = api.get(f"/sdk/tasks/{pipeline_id}/steps").json()
        done = [(s["name"], s["state"], s["resource"]) for s in steps]
        assert done == [("again", "completed", "cpu"), ("read", "completed", "cpu")], steps
        again = server.task(steps[0]["id"], token)
        assert again["parameters"] == {"n": 5} and again["parent"] == pipeline_id
        read = api.get(f"/tasks/{steps[1]['id']}/artifacts/v")
        assert pickle.loads(read.content) == 5 * 2 + 1

    stdout, _ = queued.communicate(timeout=300)
    assert queued.returncode == 0, stdout
    assert "queued on cpu" in stdout and "the controller went on here" not in stdout, stdout
    controller_id = recorded_id(stdout)
    controller = server.wait_state(controller_id, token=token, timeout=120)
    logs = server.cli("logs", str(controller_id), token=token).output
    assert (controller["state"], controller["resource"]) == ("completed", "cpu"), (controller, logs)
    with server.api(token) as api:
        steps = api.get(f"/sdk/tasks/{controller_id}/steps").json()
        placed = [(s["name"], s["resource"], s["state"]) for s in steps]
        assert placed == [("one", "cpu", "completed"), ("two", "gpu", "completed")], steps
        z = api.get(f"/tasks/{steps[1]['id']}/artifacts/z")
        assert pickle.loads(z.content) == (1 + 1) * 10
