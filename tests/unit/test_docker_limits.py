"""Docker mode's limits, mounts and reaper as pure rules (broker/pools/docker_args.py), the
argv they put in `podman run`, and the runner's reading of its cgroup's OOM kills."""

from __future__ import annotations

import asyncio

import pytest
from helpers import estates
from helpers.estates import profile

from broker.domain import Profile
from broker.errors import EstateError
from broker.pools.base import Context
from broker.pools.docker_args import (
    Limits,
    Reaper,
    check_run_arg,
    container_limits,
    limit_args,
    rootless_answer,
    userns_args,
    volume,
)
from broker.pools.docker_argv import ContainerRun, owned_argv, parse_owned, run_argv
from broker.pools.host_docker import DockerHostDriver
from broker.pools.registry import make_driver
from inside_job import oom

HOST_CPUS, HOST_MB = 32, 256 * 1024  # a host of 32 cores and 256 GiB with 2 GPUs of 80 GiB


def limits(**profile_fields: object) -> Limits:
    shape = Profile(pools=("box",), **profile_fields)  # type: ignore[arg-type]
    return container_limits(shape, HOST_CPUS, HOST_MB, 2, 80 * 1024)


def test_a_task_gets_its_profiles_cpus_and_memory():
    assert limits(cpus=4, memory_mb=16 * 1024) == Limits(4.0, 16 * 1024)
    assert limits(gpus=2, cpus=24, memory_mb=200 * 1024) == Limits(24.0, 200 * 1024)


def test_a_gpu_share_is_held_to_its_part_of_the_host():
    # Half of one of 2 GPUs: at most a quarter of the host (8 cores, 64 GiB).
    assert limits(gpu_fraction=0.5, cpus=16, memory_mb=100 * 1024) == Limits(8.0, 64 * 1024)
    assert limits(gpu_fraction=0.5, cpus=2, memory_mb=1024) == Limits(2.0, 1024)
    # 20 GiB of an 80 GiB GPU is a quarter of it: an eighth of the host.
    assert limits(gpu_memory_mb=20 * 1024, cpus=8, memory_mb=64 * 1024) == Limits(4.0, 32 * 1024)


def test_the_memory_cap_leaves_no_swap_past_it():
    assert limit_args(Limits(0.5, 64)) == ["--cpus=0.5", "--memory=64m", "--memory-swap=64m"]
    assert limit_args(None) == []


def test_rootless_podman_keeps_the_accounts_id_and_root_podman_and_docker_do_not():
    assert userns_args("podman", rootless=True) == ["--userns=keep-id"]
    assert userns_args("podman", rootless=False) == []
    assert userns_args("docker", rootless=True) == []
    assert (rootless_answer("true\n"), rootless_answer("false"), rootless_answer("?")) == (
        True,
        False,
        None,
    )


def test_selinux_relabels_the_attempts_folder_privately_and_the_runner_shared():
    assert (
        volume("/r.pyz", "/opt/r.pyz", read_only=True, relabel="z")
        == "--volume=/r.pyz:/opt/r.pyz:ro,z"
    )
    assert volume("/j/a", "/j/a", read_only=False, relabel="Z") == "--volume=/j/a:/j/a:Z"
    assert volume("/j/a", "/j/a", read_only=False, relabel=None) == "--volume=/j/a:/j/a"


def container(**changes: object) -> ContainerRun:
    fields: dict[str, object] = {
        "runtime": "podman",
        "binary": "/usr/bin/podman",
        "name": "klique-7-1-abcdef",
        "task_id": 7,
        "pool": "box",
        "image": "localhost/py:3",
        "python": "python3",
        "job_dir": "/jobs/klique-7-1-abcdef/job",
        "runner": "/srv/runner.pyz",
        "uid": 1001,
        "gid": 1001,
        "walltime_s": 3600,
        "limits": Limits(0.5, 20480),
        "installation": "abc123",
    }
    return ContainerRun(**{**fields, **changes})  # type: ignore[arg-type]


def test_the_argv_carries_the_caps_the_user_namespace_the_relabel_and_the_installation():
    argv = run_argv(container(keep_id=True, relabel=True))
    assert [a for a in argv if a.startswith(("--cpus", "--memory"))] == [
        "--cpus=0.5",
        "--memory=20480m",
        "--memory-swap=20480m",
    ]
    assert "--userns=keep-id" in argv and "--label=klique.dev/installation=abc123" in argv
    assert "--volume=/jobs/klique-7-1-abcdef:/jobs/klique-7-1-abcdef:Z" in argv
    assert argv.index("--memory=20480m") < argv.index("localhost/py:3")
    plain = run_argv(container())
    assert not any(a.startswith("--userns") or a.endswith((":Z", ",z")) for a in plain)


def test_a_pool_cannot_set_memory_or_cpus_for_every_task():
    for arg in ("--memory=8g", "--cpus=2", "--memory-swap=-1"):
        with pytest.raises(ValueError, match="set per task"):
            check_run_arg(arg)
    pools = {"box": {"kind": "host", "user_map": {"a": "a"}, "job_root": "/tmp", "mode": "docker"}}
    pools["box"]["run_args"] = ["--memory=8g"]
    with pytest.raises(EstateError, match="compute resource's cpus and memory"):
        estates.estate("<e>", resources={"cpu": profile("box")}, pools=pools)


def test_a_venv_pool_refuses_the_docker_mode_settings():
    pools = {"box": {"kind": "host", "user_map": {"a": "a"}, "job_root": "/tmp", "rootless": True}}
    with pytest.raises(EstateError, match="docker mode only"):
        estates.estate("<e>", resources={"cpu": profile("box")}, pools=pools)


def test_the_reaper_takes_only_containers_of_ended_or_unknown_tasks_seen_so_long_enough():
    reaper = Reaper(after_s=60)
    listed = {"klique-1-1-a": 1, "klique-2-1-b": 2, "klique-3-1-c": 3, "stray": None}
    assert reaper.due(listed, followed=[2], now=1000.0) == []  # just seen: too young
    assert reaper.due(listed, followed=[2, 3], now=1059.0) == []
    # Task 3 is followed again (its container was starting): its first sighting is forgotten.
    assert reaper.due(listed, followed=[2], now=1060.0) == ["klique-1-1-a", "stray"]
    assert reaper.due(listed, followed=[2], now=1119.0) == ["klique-1-1-a", "stray"]
    assert reaper.due(listed, followed=[2], now=1120.0) == ["klique-1-1-a", "klique-3-1-c", "stray"]
    assert reaper.due({}, followed=[], now=2000.0) == [] and reaper.first_seen == {}


def test_the_reaper_lists_by_pool_and_installation_as_each_runtime_reads_labels():
    podman = owned_argv("podman", "podman", "box", "abc")
    assert "--all" in podman and "--filter=label=klique.dev/pool=box" in podman
    assert "--filter=label=klique.dev/installation=abc" in podman
    assert podman[-1] == '--format={{.Names}} {{index .Labels "klique.dev/task"}}'
    assert owned_argv("docker", "docker", "box", "abc")[-1] == (
        '--format={{.Names}} {{.Label "klique.dev/task"}}'
    )
    assert parse_owned("klique-1-1-a 1\nodd \n\n") == {"klique-1-1-a": 1, "odd": None}


V1 = """12:memory:/libpod_parent/libpod-abc
0::/libpod_parent/libpod-abc
"""


def test_the_runner_finds_its_cgroups_oom_counter_in_v1_and_v2(tmp_path):
    files = oom.counter_files(V1, root="/cg")
    assert files == [
        "/cg/memory/libpod_parent/libpod-abc/memory.oom_control",
        "/cg/memory/memory.oom_control",
        "/cg/libpod_parent/libpod-abc/memory.events",
        "/cg/memory.events",
    ]
    v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"
    v2 = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n"
    assert (oom.oom_kill_count(v1), oom.oom_kill_count(v2), oom.oom_kill_count("x 1")) == (
        2,
        1,
        None,
    )
    assert not oom.killed_since(None)


def test_the_driver_sweeps_on_its_cycle_and_removes_only_the_unfollowed(tmp_path):
    pools = {"box": {"kind": "host", "user_map": {"a": "a"}, "job_root": "/tmp", "mode": "docker"}}
    estate = estates.estate("<e>", resources={"cpu": profile("box")}, pools=pools)
    driver = make_driver(estate.pools["box"], Context(estate, tmp_path, tmp_path / "r.pyz", None))
    assert isinstance(driver, DockerHostDriver)
    driver.reaper = Reaper(after_s=0)  # no wait, for the test
    commands: list[list[str]] = []

    async def command(argv: list[str]) -> tuple[int, str, str]:
        commands.append(argv)
        return 0, "klique-1-1-a 1\nklique-2-1-b 2\n" if argv[1] == "ps" else "", ""

    driver._command = command  # type: ignore[method-assign]
    asyncio.run(driver._sweep([2]))
    assert commands[0][1:3] == ["ps", "--all"]
    assert f"--filter=label=klique.dev/installation={driver.installation}" in commands[0]
    assert commands[1:] == [[driver.binary, "rm", "--force", "klique-1-1-a"]]
    assert (tmp_path / "installation-id").read_text().strip() == driver.installation
