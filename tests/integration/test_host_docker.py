"""A host pool in docker mode, for real: podman runs each task's runner in the task's image, as
alice's uid; the GPUs are fake CDI devices (tests/conftest_services.py `podman`)."""

from __future__ import annotations

import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Server, wait_for
from conftest_services import docker_estate

pytestmark = pytest.mark.podman


@pytest.fixture(scope="module")
def server(module_server_factory, podman) -> Iterator[Server]:
    yield module_server_factory(docker_estate(podman))


@pytest.fixture(scope="module")
def image(podman) -> str:
    return str(podman.image)


def submit(server: Server, code: str, resource: str = "cpu", **extra: Any) -> int:
    body = {"command": ["python3", "-c", code], "resource": resource, **extra}
    with server.api(server.make_token("alice")) as api:
        answer = api.post("/tasks", json=body)
    assert answer.status_code in (200, 201), answer.text
    return int(answer.json()["id"])


def exists(name: str) -> bool:
    return subprocess.run(["podman", "container", "exists", name]).returncode == 0


def test_a_task_runs_in_its_image_as_its_account(server, image):
    task_id = submit(server, "import os; print('uid', os.getuid(), os.getgid())", image=image)
    done = server.wait_state(task_id)
    assert (done["state"], done["exit_code"]) == ("completed", 0), done
    alice = pwd.getpwnam("alice")
    assert f"uid {alice.pw_uid} {alice.pw_gid}" in server.cli("logs", str(task_id)).output
    assert not exists(Path(done["job_dir"]).name)  # --rm


def test_a_failing_task_keeps_its_exit_code(server, image):
    done = server.wait_state(submit(server, "import sys; sys.exit(3)", image=image))
    assert (done["state"], done["exit_code"]) == ("failed", 3)


def test_cancel_stops_the_container_and_it_is_gone(server, image):
    task_id = submit(server, "import time; print('up', flush=True); time.sleep(600)", image=image)
    running = server.wait_state(task_id, {"running"})
    name = Path(running["job_dir"]).name
    assert exists(name)
    result = server.cli("cancel", str(task_id))
    assert result.exit_code == 0 and "cancelled" in result.output
    assert server.wait_state(task_id)["state"] == "cancelled"
    wait_for(lambda: not exists(name), 30, f"container {name} to be gone")


def test_a_task_past_its_walltime_is_ended_as_a_timeout(server, image):
    task_id = submit(server, "import time; time.sleep(600)", resource="short", image=image)
    done = server.wait_state(task_id, timeout=60)
    assert done["state"] == "timeout", done
    assert "walltime" in done["reason"]


def test_an_image_that_does_not_exist_fails_with_podmans_words(server):
    done = server.wait_state(submit(server, "print(1)", image="localhost/no-such-image:1"))
    assert done["state"] == "failed"
    assert "image not known" in done["reason"] and "no-such-image" in done["reason"]


def test_a_task_without_an_image_is_refused_with_the_fix(server):
    done = server.wait_state(submit(server, "print(1)"))
    assert done["state"] == "failed"
    assert "has no image" in done["reason"] and "--image" in done["reason"]


def test_two_half_gpu_tasks_share_gpu_0_each_with_its_memory_cap(server, image):
    show = (
        "import os, time; e = os.environ; print('gpu', e.get('KLIQUE_FAKE_GPU'), "
        "e.get('CUDA_VISIBLE_DEVICES'), e.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'), flush=True); "
        "time.sleep(600)"
    )
    env = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"}  # the task's own cannot lift the cap
    tasks = [submit(server, show, resource="half-gpu", image=image, env=env) for _ in range(2)]
    expected = "gpu 0 0 0=20480M"
    for task_id in tasks:
        server.wait_state(task_id, {"running"})
        wait_for(
            lambda t=task_id: expected in server.cli("logs", str(t)).output,
            30,
            f"task {task_id} to print its GPU",
        )
    assert all(server.task(t)["state"] == "running" for t in tasks)  # both at once, on 1 GPU
    for task_id in tasks:
        server.cli("cancel", str(task_id))
