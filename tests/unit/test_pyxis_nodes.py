"""A task with an image on several nodes of a Pyxis pool: Pyxis starts the image in one srun
step on one node, so Klique refuses it before any sbatch (at `estate check`, and at submission
for an estate built past the check) instead of letting it fail once Slurm grants the nodes."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.estates import estate, profile
from test_slurm_site_settings import SubmittingTransport

from broker.domain import TaskState
from broker.errors import EstateError, SubmitError
from broker.pools.base import Context
from broker.pools.slurm import SlurmDriver
from broker.preview import sample_task
from broker.transport import Completed

POOL = {"kind": "slurm", "job_root": "/jobs", "user_map": {"alice": "alice"}}


def test_estate_check_refuses_a_multi_node_resource_on_a_pyxis_pool():
    with pytest.raises(EstateError) as caught:
        estate(
            "estate.yaml",
            resources={"two-nodes": profile("p", cpus=4, nodes=2, walltime="1h")},
            pools={"p": {**POOL, "container_runtime": "pyxis"}},
        )
    words = str(caught.value)
    assert "resources.two-nodes.profile.pools.0" in words
    assert "container_runtime: pyxis" in words and "asks for 2 nodes" in words
    assert "fix: set the resource's nodes: 1" in words


@pytest.mark.parametrize("runtime", ["enroot", "apptainer", None])
def test_a_multi_node_resource_on_a_pool_with_another_runtime_is_accepted(runtime):
    pool = {**POOL, "container_runtime": runtime} if runtime else POOL
    estate(resources={"two-nodes": profile("p", nodes=2)}, pools={"p": pool})


def test_a_one_node_resource_on_a_pyxis_pool_is_accepted():
    estate(
        resources={"one": profile("p", nodes=1)},
        pools={"p": {**POOL, "container_runtime": "pyxis"}},
    )


def _pyxis_pool_of_two_nodes() -> tuple[SlurmDriver, list[list[str]], object]:
    """A Pyxis pool whose compute resource asks for two nodes: an estate the check refuses,
    put together past it (as a server that loaded it before the check would hold it)."""
    one_node = estate(
        resources={"r": profile("p", cpus=2, walltime="1h")},
        pools={"p": {**POOL, "container_runtime": "pyxis"}},
    )
    resource = one_node.resources["r"]
    resources = {"r": replace(resource, profile=replace(resource.profile, nodes=2))}
    two_nodes = replace(one_node, resources=resources)
    sent: list[list[str]] = []

    def answer(argv: list[str], account: str) -> Completed:
        sent.append(argv)
        return Completed(0, "41\n", "")

    context = Context(two_nodes, Path("."), Path(__file__), None)
    driver = SlurmDriver(two_nodes.pools["p"], context, SubmittingTransport(answer))
    return driver, sent, two_nodes


def test_a_task_with_an_image_on_several_nodes_of_a_pyxis_pool_is_refused_before_sbatch():
    driver, sent, two_nodes = _pyxis_pool_of_two_nodes()
    task = sample_task(two_nodes, "r", "alice")
    task = replace(task, id=3, state=TaskState.PLACED, spec=replace(task.spec, image="alpine:3"))
    with pytest.raises(SubmitError) as caught:
        asyncio.run(driver.submit(task, "token"))
    assert "container_runtime: pyxis" in str(caught.value) and "fix:" in str(caught.value)
    assert not [argv for argv in sent if "sbatch" in " ".join(argv)]


def test_a_task_without_an_image_on_several_nodes_of_a_pyxis_pool_runs_on_every_node():
    driver, _, two_nodes = _pyxis_pool_of_two_nodes()
    script = driver.render(sample_task(two_nodes, "r", "alice"), "/jobs/klique-0")
    assert "srun --nodes=2 --ntasks-per-node=1" in script and "--container-image" not in script
