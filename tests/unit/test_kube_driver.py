"""The Kubernetes driver's decisions over an in-memory API (the adapter's few calls): adoption
of a submission whose outcome was never recorded, a vanished pod, clean-up after the end,
refusals, and the start-up check."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from broker.domain import Task, TaskSpec, TaskState
from broker.errors import SubmitError, TransportError
from broker.estate import parse_estate
from broker.pools.base import Context
from broker.pools.kube_api import Conflict, KubeError
from broker.pools.kubernetes import KubernetesDriver

ESTATE = """
resources:
  cpu:
    profile: {cpus: 1, memory: 1G, walltime: 1h, pools: [k8s]}
pools:
  k8s:
    kind: kubernetes
    namespace: klique
    server: http://127.0.0.1:1
    installation: site
"""


class MemoryApi:
    """Pods, secrets and configmaps by name; what was deleted; errors to raise."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.deleted: list[tuple[str, str]] = []
        self.refuse_pods: Exception | None = None
        self.list_error: Exception | None = None

    async def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        key = (manifest["kind"], manifest["metadata"]["name"])
        if manifest["kind"] == "Pod" and self.refuse_pods is not None:
            raise self.refuse_pods
        if key in self.objects:
            raise Conflict(409, "already exists")
        obj = json.loads(json.dumps(manifest))
        obj["metadata"]["resourceVersion"] = str(len(self.objects) + 2)
        self.objects[key] = obj
        return obj

    async def get_config_map(self, name: str) -> dict[str, Any] | None:
        return self.objects.get(("ConfigMap", name))

    async def delete(self, kind: str, name: str, grace_s: int | None = None) -> bool:
        self.deleted.append((kind, name))
        return self.objects.pop((kind, name), None) is not None

    async def list_pods(self, labels: Mapping[str, str]) -> tuple[list[dict[str, Any]], str]:
        if self.list_error is not None:
            raise self.list_error
        pods = [o for (kind, _), o in self.objects.items() if kind == "Pod"]
        return pods, "1"

    async def watch_pods(
        self, labels: Mapping[str, str], resource_version: str
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        await asyncio.Event().wait()
        yield "ADDED", {}

    async def pod_log(self, name: str, tail_lines: int | None = None) -> str:
        return f"log of {name}\n"

    async def close(self) -> None:
        pass


def make(tmp_path: Path) -> tuple[KubernetesDriver, MemoryApi]:
    estate = parse_estate(ESTATE)
    runner = tmp_path / "runner.pyz"
    runner.write_bytes(b"PK runner")
    api = MemoryApi()
    context = Context(estate, tmp_path, runner, "http://klique:8000")
    driver = KubernetesDriver(estate.pools["k8s"], context, api=api)  # type: ignore[arg-type]
    return driver, api


def task(state: TaskState = TaskState.SUBMITTED, task_id: int = 3) -> Task:
    spec = TaskSpec(command=("python", "-c", "print(1)"), resource="cpu")
    job_dir = f"/klique/job/klique-{task_id}-1"
    native_id = None if state is TaskState.PLACED else f"klique-{task_id}-1"
    return Task(
        id=task_id,
        spec=spec,
        owner="alice",
        team=None,
        state=state,
        attempts=1,
        job_dir=job_dir,
        native_id=native_id,
    )


def pod(name: str, task_id: int, phase: str, code: int | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if code is not None:
        terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
        status["containerStatuses"] = [{"name": "task", "state": {"terminated": terminated}}]
    labels = {"klique.dev/task": str(task_id)}
    return {"metadata": {"name": name, "labels": labels, "resourceVersion": "5"}, "status": status}


async def polled(driver: KubernetesDriver, tasks: list[Task]) -> dict[int, Any]:
    try:
        await driver.poll(tasks)  # starts the watch
        await asyncio.wait_for(driver._synced.wait(), 5)
        return await driver.poll(tasks)
    finally:
        await driver.close()


def test_submit_puts_the_task_in_a_secret_and_makes_the_pod(tmp_path):
    driver, api = make(tmp_path)

    async def go() -> None:
        done = await driver.submit(task(TaskState.PLACED), "the-token")
        assert done.native_id == "klique-3-1"

    asyncio.run(go())
    secret = api.objects[("Secret", "klique-3-1-task")]
    document = json.loads(base64.b64decode(secret["data"]["task.json"]))
    assert document["report"] == {"url": "http://klique:8000", "token": "the-token"}
    assert ("Pod", "klique-3-1") in api.objects
    [config_map] = [o for (kind, _), o in api.objects.items() if kind == "ConfigMap"]
    assert base64.b64decode(config_map["binaryData"]["klique-runner.pyz"]) == b"PK runner"


def test_a_refused_pod_takes_its_secret_with_it_and_a_foreign_pod_is_not_adopted(tmp_path):
    driver, api = make(tmp_path)
    api.refuse_pods = KubeError(422, "Pod is invalid")
    with pytest.raises(KubeError):
        asyncio.run(driver.submit(task(TaskState.PLACED), "t"))
    assert ("Secret", "klique-3-1-task") not in api.objects
    api.refuse_pods = None
    api.objects[("Pod", "klique-3-1")] = pod("klique-3-1", 99, "Running")
    driver.pods["klique-3-1"] = api.objects[("Pod", "klique-3-1")]
    with pytest.raises(SubmitError, match="not this task's"):
        asyncio.run(driver.submit(task(TaskState.PLACED), "t"))


def test_a_submission_never_recorded_is_adopted_or_made_again(tmp_path):
    driver, api = make(tmp_path)
    api.objects[("Pod", "klique-3-1")] = pod("klique-3-1", 3, "Running")
    news = asyncio.run(polled(driver, [task(TaskState.PLACED, 3), task(TaskState.PLACED, 4)]))
    assert (news[3].state, news[3].native_id) == (TaskState.SUBMITTED, "klique-3-1")
    assert news[4].state is TaskState.QUEUED


def test_a_vanished_pod_is_lost_only_after_lost_after(tmp_path):
    driver, _ = make(tmp_path)
    assert asyncio.run(polled(driver, [task()])) == {}
    driver, _ = make(tmp_path)
    driver.lost_after_s = 0
    news = asyncio.run(polled(driver, [task()]))
    assert news[3].state is TaskState.LOST and "klique-3-1" in news[3].reason


def test_finished_pods_of_recorded_tasks_are_deleted_after_their_log_is_saved(tmp_path):
    driver, api = make(tmp_path)
    api.objects[("Pod", "klique-1-1")] = pod("klique-1-1", 1, "Succeeded", 0)
    api.objects[("Secret", "klique-1-1-task")] = {"metadata": {"name": "klique-1-1-task"}}
    api.objects[("Pod", "klique-2-1")] = pod("klique-2-1", 2, "Running")
    api.objects[("Pod", "klique-3-1")] = pod("klique-3-1", 3, "Failed", 2)
    news = asyncio.run(polled(driver, [task(task_id=3)]))
    assert news[3].state is TaskState.FAILED and news[3].exit_code == 2
    assert ("Pod", "klique-1-1") in api.deleted and ("Secret", "klique-1-1-task") in api.deleted
    assert ("Pod", "klique-2-1") not in api.deleted  # still running: left alone
    assert ("Pod", "klique-3-1") not in api.deleted  # its end is not recorded yet
    saved = tmp_path / "pod-logs" / "k8s" / "klique-1-1.log"
    assert saved.read_text() == "log of klique-1-1\n"


def test_start_up_check_names_the_missing_role_and_leaves_an_outage_to_the_agent(tmp_path):
    driver, api = make(tmp_path)
    api.list_error = KubeError(403, 'pods is forbidden: User "x" cannot list resource "pods"')
    problems = asyncio.run(driver.check())
    assert len(problems) == 1 and "kubernetes-rbac.yaml" in problems[0]
    api.list_error = TransportError("connection refused")
    assert asyncio.run(driver.check()) == []  # the agent shows it unreachable meanwhile
    api.list_error = None
    assert asyncio.run(driver.check()) == []


def test_preempted_task_whose_pod_went_is_reported_preempted(tmp_path):
    driver, _ = make(tmp_path)
    news = asyncio.run(polled(driver, [replace(task(), preempted=True)]))
    assert news[3].preempted and news[3].state is TaskState.FAILED


def test_an_api_that_does_not_answer_shows_the_pool_unreachable(tmp_path):
    driver, api = make(tmp_path)
    api.list_error = TransportError("connection refused")

    async def look() -> Any:
        try:
            assert await driver.poll([task()]) == {}
            for _ in range(100):
                if driver.watch_error:
                    break
                await asyncio.sleep(0.01)
            return await driver.capacity([task()])
        finally:
            await driver.close()

    state = asyncio.run(look())
    assert not state.reachable and "connection refused" in state.reason
