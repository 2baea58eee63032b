"""A Kubernetes pool end to end: the server's driver, unchanged, against the API emulator of
tests/fakes/_kubesim/ (one per module), whose kubelet runs each pod in Podman from the pool's
image. Pods really run the runner zipapp, as alice, reporting to the server over HTTP."""

from __future__ import annotations

import pwd
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import Server, start_server, stop_server, wait_for
from helpers.estates import estate_yaml, profile
from helpers.kube import Emulator, kube_pool

pytestmark = pytest.mark.podman


def estate(url: str) -> str:
    allocation = {"cpus": 1, "memory": "400M"}
    pool = kube_pool(
        url,
        delete_grace="2s",
        shared_gpu_resource="nvidia.com/gpu.shared",
        gpu_memory="40G",
        image_pull_backoff="2s",
    )
    resources = {
        "cpu": profile("k8s", **allocation, walltime="1h"),
        "four-gpus": profile("k8s", gpus=4, **allocation, walltime="1h"),
        "short": profile("k8s", **allocation, walltime="4s"),
        "quarter-gpu": profile("k8s", gpu_fraction=0.25, **allocation, walltime="1h"),
    }
    return estate_yaml(resources=resources, pools={"k8s": pool})


@pytest.fixture(scope="module")
def cluster(podman) -> Iterator[Emulator]:
    emulator = Emulator(backoff_scale=0.1)
    yield emulator
    emulator.stop()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("k8s-home")


@pytest.fixture(scope="module")
def server(cluster: Emulator, home: Path) -> Iterator[Server]:
    path = home / "estate.yaml"
    path.write_text(estate(cluster.url))
    started = start_server(home, path)
    yield started
    stop_server(started)


def submit(server: Server, command: list[str], resource: str = "cpu", **extra: Any) -> int:
    with server.api() as api:
        answer = api.post("/tasks", json={"command": command, "resource": resource, **extra})
    assert answer.status_code in (200, 201), answer.text
    return int(answer.json()["id"])


def py(code: str) -> list[str]:
    return ["python3", "-c", code]


def test_a_task_runs_to_completion_and_its_pod_is_cleaned_up(server, cluster, home):
    task_id = submit(server, py("import os; print('hello from a pod as', os.getuid())"))
    done = server.wait_state(task_id)
    assert (done["state"], done["exit_code"]) == ("completed", 0)
    alice = pwd.getpwnam("alice").pw_uid
    assert f"hello from a pod as {alice}" in server.cli("logs", str(task_id)).output
    wait_for(lambda: not cluster.pods(task_id), 30, "the finished task's pod to be deleted")
    saved = home / "pod-logs" / "k8s" / f"klique-{task_id}-1.log"
    assert saved.is_file()


def test_a_share_of_a_gpu_runs_with_its_memory_cap_whatever_its_env(server):
    show = "import os; print('cap', os.environ['CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'])"
    env = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"}
    task_id = submit(server, py(show), resource="quarter-gpu", env=env)
    assert server.wait_state(task_id)["state"] == "completed"
    assert "cap 0=10240M" in server.cli("logs", str(task_id)).output


def test_a_failing_task_fails_with_its_exit_code(server):
    task_id = submit(server, py("import sys; sys.exit(3)"))
    done = server.wait_state(task_id)
    assert (done["state"], done["exit_code"]) == ("failed", 3)


def test_a_task_past_its_memory_limit_is_oom_killed(server):
    task_id = submit(server, py("import time; b = b'x' * (600 << 20); time.sleep(30)"))
    done = server.wait_state(task_id)
    assert done["state"] == "failed"
    assert done["reason"].startswith("OOMKilled")


def test_an_image_that_cannot_be_pulled_fails_the_task_with_the_reason(server, cluster):
    task_id = submit(server, py("print(1)"), image="localhost/no-such-image:1")
    done = server.wait_state(task_id)
    assert done["state"] == "failed"
    assert "ErrImagePull" in done["reason"] or "ImagePullBackOff" in done["reason"]
    assert "no-such-image" in done["reason"]
    wait_for(lambda: not cluster.pods(task_id), 30, "the failed task's pod to be deleted")


def test_an_unschedulable_pod_says_why_in_klique_why_and_cancel_deletes_it(server, cluster):
    task_id = submit(server, py("print(1)"), resource="four-gpus")
    server.wait_state(task_id, {"pending"})
    wait_for(
        lambda: "Insufficient nvidia.com/gpu" in server.task(task_id)["reason"],
        30,
        "the scheduler's message",
    )
    message = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu"

    def explained() -> str | None:
        output = server.cli("why", str(task_id)).output
        return output if message in output else None

    why = wait_for(explained, 30, "klique why to show the scheduler's message")
    assert f"task {task_id} waits" in why
    assert server.cli("cancel", str(task_id)).exit_code == 0
    assert server.wait_state(task_id)["state"] == "cancelled"
    wait_for(lambda: not cluster.pods(task_id), 30, "the cancelled task's pod to be deleted")


def test_cancel_stops_a_running_pod(server, cluster):
    task_id = submit(server, py("import time; time.sleep(120)"))
    server.wait_state(task_id, {"running"})
    assert server.cli("cancel", str(task_id)).exit_code == 0
    assert server.wait_state(task_id)["state"] == "cancelled"
    wait_for(lambda: not cluster.pods(task_id), 30, "the cancelled task's pod to be deleted")


def test_walltime_becomes_the_pods_deadline(server):
    task_id = submit(server, py("import time; time.sleep(120)"), resource="short")
    done = server.wait_state(task_id)
    assert done["state"] == "timeout"
    assert "activeDeadlineSeconds 4" in done["reason"]


def test_one_list_then_watch_and_a_new_list_after_410_gone(server, cluster):
    lists = cluster.lists()
    assert lists == 1  # every task so far was followed by the one watch, not by a request each
    task_id = submit(server, py("import time; time.sleep(1); print('after')"))
    server.wait_state(task_id, {"running", "completed"})
    assert httpx.post(f"{cluster.url}/emulator/compact").status_code == 200
    wait_for(lambda: cluster.lists() == 2, 30, "the driver to list again after 410")
    assert server.wait_state(task_id)["state"] == "completed"
    again = submit(server, py("print('still followed')"))
    assert server.wait_state(again)["state"] == "completed"


def test_a_restarted_server_adopts_running_pods(cluster, server, home):
    gate_path = "os.environ['KLIQUE_JOB_DIR'] + '/gate'"
    code = f"import os, time\nwhile not os.path.exists({gate_path}): time.sleep(0.1)\nprint('ok')"
    task_id = submit(server, py(code))
    server.wait_state(task_id, {"running"})
    [pod] = cluster.pods(task_id)
    gate = cluster.job_folder(pod) / "gate"  # alice's pod waits for it in its job folder
    stop_server(server)
    lists = cluster.lists()
    restarted = start_server(home, home / "estate.yaml")
    try:
        wait_for(lambda: cluster.lists() > lists, 30, "the new server to list pods")
        assert restarted.wait_state(task_id, {"running"})["native_id"] == f"klique-{task_id}-1"
        assert [p["metadata"]["uid"] for p in cluster.pods(task_id)] == [pod["metadata"]["uid"]]
        gate.touch()
        done = restarted.wait_state(task_id)
        assert (done["state"], done["exit_code"]) == ("completed", 0)
    finally:
        stop_server(restarted)
