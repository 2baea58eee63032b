"""A host pool in docker mode, for real: podman runs each task's runner in the task's image, as
alice's uid; the GPUs are fake CDI devices (tests/conftest_services.py `podman`)."""

from __future__ import annotations

import pwd
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Server, shared_folder, start_server, stop_server, wait_for
from conftest_services import docker_estate

pytestmark = pytest.mark.podman


# A half of the GPU with a small memory cap, for the task that allocates past it.
SMALL_HALF_GPU = (
    "  small-half-gpu:\n    profile: {gpu_fraction: 0.5, cpus: 1, memory: 96M, walltime: 1h, "
    "pools: [docker-box]}\n"
)


@pytest.fixture(scope="module")
def server(module_server_factory, podman) -> Iterator[Server]:
    estate = docker_estate(podman, "docker-box").replace(
        "resources:\n", "resources:\n" + SMALL_HALF_GPU, 1
    )
    yield module_server_factory(estate)


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
    name = Path(done["job_dir"]).name
    wait_for(lambda: not exists(name), 30, f"container {name} to be removed (--rm)")


def test_a_failing_task_keeps_its_exit_code(server, image):
    done = server.wait_state(submit(server, "import sys; sys.exit(3)", image=image))
    assert (done["state"], done["exit_code"]) == ("failed", 3)


def test_cancel_stops_the_container_and_it_is_gone(server, image):
    task_id = submit(server, "import time; print('up', flush=True); time.sleep(600)", image=image)
    running = server.wait_state(task_id, {"running"})
    name = Path(running["job_dir"]).parent.name  # the attempt's folder, which it mounts
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


def test_a_task_past_its_memory_cap_ends_out_of_memory_in_show_and_why(server, image):
    hog = "x = bytearray(400 * 1024 * 1024); print('allocated', flush=True)"
    task_id = submit(server, hog, resource="small-half-gpu", image=image)
    done = server.wait_state(task_id)
    assert done["state"] == "failed" and done["reason"].startswith("out of memory"), done
    assert "memory cap of 96 MiB" in done["reason"] and done["exit_code"] == 137
    assert "allocated" not in server.cli("logs", str(task_id)).output
    for command in ("show", "why"):
        shown = server.cli(command, str(task_id))
        assert "out of memory" in shown.output, (command, shown.output)
    name = Path(done["job_dir"]).parent.name
    wait_for(lambda: not exists(name), 30, f"container {name} to be removed once read")


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


def gpu_estate(podman: Any, pools: dict[str, str]) -> str:
    """One 1-GPU resource over host pools in docker mode, each given its GPUs by `pools`
    (name -> its GPU setting); tasks without an image run in the pool's."""
    text = "resources:\n  1-gpu:\n    profile: {gpus: 1, cpus: 1, memory: 1G, walltime: 1h, "
    text += f"pools: [{', '.join(pools)}]}}\npools:\n"
    for name, gpus in pools.items():
        text += (
            f"  {name}:\n    kind: host\n    slots: 2\n    {gpus}\n    mode: docker\n"
            f"    image: {podman.image}\n    gpu_device: {podman.gpu_device}\n"
            f"    run_args: {list(podman.run_args)}\n    user_map: {{alice: alice}}\n"
            "    job_root: $JOB_ROOT\n"
        )
    return text


@pytest.mark.parametrize(
    "pools",
    [{"whole-host": "gpus: 2"}, {"gpu-set-a": "gpu_ids: [0]", "gpu-set-b": "gpu_ids: [1]"}],
    ids=["one-pool-owns-both-gpus", "one-pool-per-gpu"],
)
def test_two_one_gpu_tasks_run_at_once_each_on_its_own_gpu(server_factory, podman, pools):
    server = server_factory(gpu_estate(podman, pools))
    show = (
        "import os, time; e = os.environ; "
        "print('gpu', e.get('KLIQUE_FAKE_GPU'), e.get('CUDA_VISIBLE_DEVICES'), flush=True); "
        "time.sleep(600)"
    )
    tasks = [submit(server, show, resource="1-gpu") for _ in range(2)]
    seen = {}
    for task_id in tasks:
        server.wait_state(task_id, {"running"})

        def printed(t: int = task_id) -> str | None:
            lines = [x for x in server.cli("logs", str(t)).output.splitlines() if "gpu " in x]
            return lines[0] if lines else None

        seen[task_id] = wait_for(printed, 30, f"task {task_id} to print its GPU")
    shown = [server.task(t) for t in tasks]
    assert all(t["state"] == "running" for t in shown)  # both at once
    # Each sees its own device, numbered 0 inside its container.
    assert sorted(line.split("gpu ", 1)[1] for line in seen.values()) == ["0 0", "1 0"]
    on = [(t["pool"], t["gpu_ids"]) for t in shown]
    expected = {"whole-host": [("whole-host", [0]), ("whole-host", [1])]}
    expected["gpu-set-a"] = [("gpu-set-a", [0]), ("gpu-set-b", [1])]
    assert sorted(on) == expected[next(iter(pools))], on
    for task_id in tasks:
        server.cli("cancel", str(task_id))


def test_a_killed_server_keeps_its_running_container_and_reaps_what_outlived_its_task(
    tmp_path, podman
):
    job_root = shared_folder("klique-jobs-")
    estate = tmp_path / "estate.yaml"
    text = docker_estate(podman, "restarted").replace("$JOB_ROOT", str(job_root))
    estate.write_text(text.replace("    mode: docker\n", "    mode: docker\n    reap_after: 2s\n"))
    server = start_server(tmp_path / "home", estate)
    task_id, ended, leftovers = 0, 0, []
    try:
        ended = submit(server, "print(1)", image=podman.image)
        assert server.wait_state(ended)["state"] == "completed"
        code = "import os, time\nwhile not os.path.exists('go'): time.sleep(0.1)\nprint('went')"
        task_id = submit(server, code, image=podman.image)
        job_dir = Path(server.wait_state(task_id, {"running"})["job_dir"])
        server.process.send_signal(signal.SIGKILL)  # a crash: no shutdown of any kind
        server.process.wait()
        # What a crash between recording a task's end and removing its container leaves: a
        # container of this pool and installation whose task has ended; and another
        # installation's, with the same pool name, which is not this server's to touch.
        installation = (tmp_path / "home" / "installation-id").read_text().strip()
        leftovers = [
            leftover(podman, ended, installation),
            leftover(podman, ended, "another-installation"),
        ]
        server = start_server(tmp_path / "home", estate)
        wait_for(lambda: not exists(leftovers[0]), 60, "the ended task's container to be reaped")
        found = server.task(task_id)
        assert (found["state"], found["native_id"]) == ("running", job_dir.parent.name)
        assert len(labelled(task_id)) == 1 and exists(leftovers[1])
        (job_dir / "go").touch()
        done = server.wait_state(task_id)
        assert (done["state"], done["exit_code"]) == ("completed", 0)
        assert "went" in server.cli("logs", str(task_id)).output
    finally:
        stop_server(server)
        for container in labelled(task_id) + leftovers:  # a failed run's, running on
            subprocess.run(["podman", "rm", "--force", container], capture_output=True, check=False)
        shutil.rmtree(job_root, ignore_errors=True)


def leftover(podman: Any, task_id: int, installation: str) -> str:
    """A container labelled as Klique labels a task's, sleeping: started by hand."""
    name = f"klique-leftover-{task_id}-{installation}"
    labels = [f"klique.dev/task={task_id}", "klique.dev/pool=restarted"]
    labels.append(f"klique.dev/installation={installation}")
    argv = ["podman", "run", "--detach", f"--name={name}", *podman.run_args]
    argv += [f"--label={label}" for label in labels]
    subprocess.run([*argv, podman.image, "sleep", "600"], capture_output=True, check=True)
    return name


def labelled(task_id: int) -> list[str]:
    argv = ["podman", "ps", "--all", f"--filter=label=klique.dev/task={task_id}"]
    argv += ["--filter=label=klique.dev/pool=restarted", "-q"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
