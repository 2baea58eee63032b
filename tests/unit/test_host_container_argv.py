"""Docker mode of a host pool without a container: its settings, and the argv that starts a
task's container (broker/pools/host_docker.py)."""

from __future__ import annotations

import asyncio
import os
import pwd
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from helpers import estates
from helpers.estates import profile

from broker.domain import Estate, Task, TaskSpec, TaskState
from broker.errors import EstateError, NotPermitted, SubmitError
from broker.pools.base import Context
from broker.pools.docker_argv import (
    RUNNER_PATH,
    ContainerRun,
    container_name,
    mount_folder,
    run_argv,
)
from broker.pools.host import HostDriver
from broker.pools.host_docker import DockerHostDriver, image_of, private_group_problem
from broker.pools.registry import make_driver

RESOURCES = {
    "cpu": profile("box", cpus=1, memory="1G", walltime="2h"),
    "half": profile("box", gpu_fraction=0.5, cpus=1, memory="1G", walltime="1h"),
    "two": profile("box", gpus=2, cpus=1, memory="1G", walltime="1h"),
}
BOX = {
    "kind": "host",
    "gpus": 4,
    "gpu_memory": "80G",
    "user_map": {"alice": "alice"},
    "job_root": "/tmp",
}
DOCKER = {"mode": "docker"}


def estate(settings: Mapping[str, Any] = DOCKER, **others: Mapping[str, Any]) -> Estate:
    """The host pool `box` with these settings besides BOX's (docker mode unless told), and
    the `others` pools."""
    pools = {"box": {**BOX, **settings}, **others}
    return estates.estate("<estate>", resources=RESOURCES, pools=pools)


def refusal(settings: Mapping[str, Any], **others: Mapping[str, Any]) -> str:
    with pytest.raises(EstateError) as caught:
        estate(settings, **others)
    return str(caught.value)


def run(**changes: object) -> ContainerRun:
    fields: dict[str, object] = {
        "runtime": "podman",
        "binary": "/usr/bin/podman",
        "name": "klique-7-1-abcdef",
        "task_id": 7,
        "pool": "box",
        "image": "localhost/py:3",
        "python": "python3",
        "job_dir": "/jobs/klique-7-1-abcdef/job",
        "runner": "/srv/klique/runner/klique-runner.pyz",
        "uid": 1001,
        "gid": 1001,
        "walltime_s": 3600,
    }
    return ContainerRun(**{**fields, **changes})  # type: ignore[arg-type]


def task(resource: str = "cpu", image: str | None = "localhost/py:3", **kw: object) -> Task:
    return Task(
        id=7,
        spec=TaskSpec(command=("python3", "x.py"), resource=resource, image=image),
        owner="alice",
        team=None,
        job_dir="/jobs/klique-7-1-abcdef/job",
        **{"state": TaskState.PLACED, **kw},  # type: ignore[arg-type]
    )


def test_a_podman_container_has_the_accounts_ids_two_mounts_and_no_privileges():
    argv = run_argv(run(gpu_ids=(2,), run_args=("--ulimit=nofile=1024:1024",)))
    assert argv[:3] == ["/usr/bin/podman", "run", "--detach"]
    # No --rm: the driver reads how the container ended (OOMKilled) before it removes it.
    assert "--rm" not in argv and "--pull=never" in argv and "--name=klique-7-1-abcdef" in argv
    assert "--user=1001:1001" in argv
    assert "--security-opt=no-new-privileges" in argv and "--cap-drop=all" in argv
    mounts = [a for a in argv if a.startswith(("--volume", "-v", "--mount"))]
    assert mounts == [
        f"--volume=/srv/klique/runner/klique-runner.pyz:{RUNNER_PATH}:ro",
        "--volume=/jobs/klique-7-1-abcdef:/jobs/klique-7-1-abcdef",
    ]
    assert "--label=klique.dev/task=7" in argv and "--label=klique.dev/pool=box" in argv
    assert "--device=nvidia.com/gpu=2" in argv and "--timeout=3600" in argv
    image = argv.index("localhost/py:3")
    assert argv[image - 1] == "--ulimit=nofile=1024:1024"  # the site's limits come before it
    assert argv[image:] == ["localhost/py:3", "python3", RUNNER_PATH, "/jobs/klique-7-1-abcdef/job"]


def test_docker_names_gpus_with_its_hook_and_has_no_timeout():
    argv = run_argv(run(runtime="docker", binary="/usr/bin/docker", gpu_ids=(0, 3)))
    assert argv[argv.index("--gpus") + 1] == '"device=0,3"'
    assert not any(a.startswith(("--timeout", "--device")) for a in argv)


def test_no_container_runs_as_root():
    with pytest.raises(NotPermitted, match="never runs a container as root"):
        run_argv(run(uid=0))


def test_a_task_without_an_image_is_refused_with_what_where_and_the_fix():
    with pytest.raises(SubmitError) as caught:
        image_of(task(image=None))
    words = str(caught.value)
    assert "task 7" in words and "docker mode" in words and "has no image" in words
    assert "--image" in words and "venv mode" in words


@pytest.mark.parametrize(
    "image", ["--privileged", "-v /:/host", "localhost/py:3 --privileged", "/srv/images/py.sif"]
)
def test_an_image_that_is_not_a_reference_is_refused(image):
    with pytest.raises(SubmitError, match="fix"):
        image_of(task(image=image))


def test_a_docker_scheme_is_dropped():
    assert image_of(task(image="docker://ghcr.io/org/py:3")) == "ghcr.io/org/py:3"


def test_a_task_without_an_image_runs_in_the_pools_and_its_own_image_wins(tmp_path: Path):
    e = estate({**DOCKER, "image": "docker://localhost/python:3.11"})
    driver = make_driver(e.pools["box"], Context(e, tmp_path, tmp_path / "r.pyz", None))
    assert isinstance(driver, DockerHostDriver)
    assert image_of(task(image=None), driver.image) == "localhost/python:3.11"
    assert image_of(task(image="ghcr.io/org/py:3"), driver.image) == "ghcr.io/org/py:3"


@pytest.mark.parametrize("image", ["/srv/images/py.sif", "--privileged", "py:3 -v /:/h"])
def test_a_pool_image_that_is_not_a_reference_is_refused_at_load(image):
    words = refusal({**DOCKER, "image": image})
    assert "the pool's image" in words and "box" in words


def test_a_docker_mode_pool_gets_the_container_driver(tmp_path: Path):
    e = estate({**DOCKER, "run_args": ["--ulimit=nproc=1000:1000"]})
    driver = make_driver(e.pools["box"], Context(e, tmp_path, tmp_path / "r.pyz", None))
    assert isinstance(driver, DockerHostDriver)
    assert driver.run_args == ("--ulimit=nproc=1000:1000",) and driver.python == "python3"
    plain = estate({})
    assert type(make_driver(plain.pools["box"], Context(plain, tmp_path, tmp_path, None))) is (
        HostDriver
    )


def test_the_runner_is_told_its_gpus_from_0_and_a_fractions_memory_cap(tmp_path: Path):
    e = estate()
    driver = make_driver(e.pools["box"], Context(e, tmp_path, tmp_path / "r.pyz", None))
    whole = driver.task_document(task("two"), "t", (2, 3))
    assert whole["gpus"] == [0, 1] and "gpu_memory_limit_mb" not in whole
    assert whole["image"] is None and whole["runtime"] is None  # the runner is in the image
    half = driver.task_document(task("half"), "t", (1,))
    assert half["gpus"] == [0] and half["gpu_memory_limit_mb"] == 40960


@pytest.mark.parametrize(
    "arg",
    [
        "--privileged",
        "--volume=/:/host",
        "-v=/:/host",
        "--mount=type=bind,src=/,dst=/host",
        "--cap-add=ALL",
        "--device=/dev/sda",
        "--user=0",
        "--security-opt=seccomp=unconfined",
        "--network=container:other",
        "--ulimit=nofile=1024 --privileged",
    ],
)
def test_run_args_that_mount_add_privileges_or_change_the_user_are_refused(arg):
    words = refusal({**DOCKER, "run_args": [arg]})
    assert "run_args" in words and "is not allowed" in words and "--ulimit=..." in words


def test_container_settings_need_docker_mode_and_exclude_a_runner_runtime():
    assert "docker mode only" in refusal({"runtime": "docker"})
    assert "docker mode only" in refusal({"image": "localhost/python:3.11"})
    assert "container_runtime" in refusal({**DOCKER, "container_runtime": "apptainer"})
    assert "only its job folder" in refusal({**DOCKER, "cache_dir": "/srv/cache"})
    assert "CDI device kind" in refusal({**DOCKER, "gpu_device": "nvidia.com/gpu --x"})
    assert "mode" in refusal({"mode": "kubernetes"})


def test_gpu_ids_name_the_pools_gpus_and_say_how_many():
    pool = estate({"gpu_ids": [7, 2, 3, 5]}).pools["box"]  # with the template's gpus: 4
    assert (pool.gpus, pool.devices) == (4, (7, 2, 3, 5))
    assert estate({}).pools["box"].devices == (0, 1, 2, 3)
    words = refusal({"gpu_ids": [2, 3]})
    assert "gpus is 4 but gpu_ids names 2" in words and "fix" in words


def test_two_pools_naming_the_same_gpu_are_refused():
    other = {"kind": "host", "gpu_ids": [3, 4]}
    words = refusal({"gpu_ids": [0, 1, 2, 3]}, other=other)
    assert "pools.other.gpu_ids" in words and "GPU 3 belongs to pool box as well" in words


@pytest.mark.parametrize("ids", [[1, 1], [-1], [], ["a"]])
def test_gpu_ids_that_are_not_distinct_gpu_numbers_are_refused(ids: list[object]):
    assert "gpu_ids" in refusal({"gpu_ids": ids})


def observe(
    tmp_path: Path,
    settings: Mapping[str, Any],
    started_at: float,
    alive: bool,
    inspected: str = "false 137",
) -> tuple[Any, list]:
    """What the driver makes of a task whose container is (not) running and left no exit file,
    with the runtime's commands recorded instead of run."""
    e = estate(settings)
    driver = make_driver(e.pools["box"], Context(e, tmp_path, tmp_path / "r.pyz", None))
    assert isinstance(driver, DockerHostDriver)
    commands: list[list[str]] = []

    async def command(argv: list[str]) -> tuple[int, str, str]:
        commands.append(argv)
        driver.containers.clear()  # a stop ends it
        return 0, inspected if argv[1] == "inspect" else "", ""

    async def no_files(paths: object, account: str) -> dict[str, bytes]:
        return {}

    driver._command = command  # type: ignore[method-assign]
    driver.transport.read_files = no_files  # type: ignore[method-assign]
    running = task(state=TaskState.RUNNING, native_id="klique-7-1-abcdef", started_at=started_at)
    driver.containers = {"klique-7-1-abcdef"} if alive else set()
    return asyncio.run(driver._observe(running, {})), commands


def test_a_container_gone_past_its_walltime_is_a_timeout_and_before_it_is_lost(tmp_path):
    late, commands = observe(tmp_path, DOCKER, time.time() - 3 * 3600, alive=False)
    assert late.state is TaskState.TIMEOUT and "walltime (7200 s)" in late.reason
    early, _ = observe(tmp_path, DOCKER, time.time(), alive=False)
    assert early.state is TaskState.LOST and "exit.json" in early.reason
    # podman's --timeout ended it: nothing stopped; read (OOMKilled?) and removed.
    assert [argv[1] for argv in commands] == ["inspect", "rm"]


def test_a_container_the_oom_killer_ended_reads_out_of_memory_with_its_cap(tmp_path):
    seen, commands = observe(tmp_path, DOCKER, time.time(), alive=False, inspected="true 137")
    assert (seen.state, seen.exit_code) == (TaskState.FAILED, 137)
    assert seen.reason.startswith("out of memory") and "cap of 1024 MiB" in seen.reason
    assert commands[-1][1:] == ["rm", "--force", "klique-7-1-abcdef"]


def test_docker_has_no_timeout_so_the_driver_stops_a_task_past_its_walltime(tmp_path):
    seen, commands = observe(
        tmp_path, {**DOCKER, "runtime": "docker"}, time.time() - 3 * 3600, True
    )
    assert commands[0][1:] == ["stop", "--time=10", "klique-7-1-abcdef"]
    assert seen.state is TaskState.TIMEOUT
    _, none = observe(tmp_path, {**DOCKER, "runtime": "docker"}, time.time(), alive=True)
    assert none == []


def test_the_container_mounts_the_attempts_folder_and_is_named_after_it():
    assert container_name(task()) == "klique-7-1-abcdef"
    assert mount_folder("/jobs/klique-7-1-abcdef/job") == "/jobs/klique-7-1-abcdef"


def test_an_account_without_a_private_group_is_named_with_the_reason():
    own = pwd.getpwuid(os.getuid())
    assert private_group_problem("somebody-else", own.pw_gid) is not None
    assert "does not exist" in str(private_group_problem("x", 2**31 - 7))
