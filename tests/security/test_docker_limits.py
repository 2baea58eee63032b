"""A task on a host pool in docker mode cannot take more of the host than its compute resource
gives it, and a container that outlived its task does not keep running: the reaper removes it,
and never another installation's container nor one that has just started."""

from __future__ import annotations

import pytest

from broker.domain import Profile
from broker.pools.docker_args import Reaper, check_run_arg, container_limits
from broker.pools.docker_argv import ContainerRun, owned_argv, run_argv


def container(profile: Profile) -> list[str]:
    """The argv of a task's container with the caps its profile gives it on a host of 8 cores,
    32 GiB and 1 GPU."""
    limits = container_limits(profile, 8, 32 * 1024, 1, 80 * 1024)
    run = ContainerRun(
        runtime="podman",
        binary="/usr/bin/podman",
        name="klique-7-1-abcdef",
        task_id=7,
        pool="box",
        image="localhost/py:3",
        python="python3",
        job_dir="/jobs/klique-7-1-abcdef/job",
        runner="/srv/runner.pyz",
        uid=1001,
        gid=1001,
        walltime_s=3600,
        limits=limits,
        installation="abc",
    )
    return run_argv(run)


def test_a_tasks_container_is_capped_at_its_profile_and_cannot_swap_past_it():
    argv = container(Profile(pools=("box",), cpus=2, memory_mb=4096))
    assert "--cpus=2" in argv and "--memory=4096m" in argv
    assert "--memory-swap=4096m" in argv  # the default (twice the memory) pages past the cap


def test_a_fraction_of_a_gpu_cannot_take_more_of_the_host_than_its_share():
    # Asks for the whole host with a quarter of its one GPU: gets a quarter of the host.
    argv = container(Profile(pools=("box",), gpu_fraction=0.25, cpus=8, memory_mb=32 * 1024))
    assert "--cpus=2" in argv and "--memory=8192m" in argv


@pytest.mark.parametrize("arg", ["--memory=0", "--memory-swap=-1", "--cpus=64"])
def test_a_pools_run_args_cannot_lift_the_per_task_caps(arg):
    with pytest.raises(ValueError, match="set per task"):
        check_run_arg(arg)


def test_a_container_that_outlived_its_task_is_reaped_after_the_bound():
    reaper = Reaper(after_s=300)
    listed = {"klique-1-1-aaaa": 1, "klique-2-1-bbbb": 2}
    assert reaper.due(listed, followed=[2], now=0.0) == []  # maybe starting: not yet
    assert reaper.due(listed, followed=[2], now=300.0) == ["klique-1-1-aaaa"]


def test_the_reaper_lists_only_its_own_installations_containers_of_the_pool():
    argv = owned_argv("podman", "/usr/bin/podman", "box", "abc")
    assert "--filter=label=klique.dev/installation=abc" in argv
    assert "--filter=label=klique.dev/pool=box" in argv
    assert "--label=klique.dev/installation=abc" in container(Profile(pools=("box",)))
