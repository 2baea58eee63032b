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
from broker.errors import SubmitError, SubmitUnknown, TemplateError, TransportError
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
        self.pod_faults: list[Exception] = []  # the next pod creates' refusals, in order
        self.drop_after_create = 0  # pod creates made, then answered by a cut connection
        self.get_error: Exception | None = None
        self.creates: list[tuple[str, str]] = []
        self.logs_asked: list[tuple[str, str]] = []

    async def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        key = (manifest["kind"], manifest["metadata"]["name"])
        self.creates.append(key)
        if manifest["kind"] == "Pod" and self.refuse_pods is not None:
            raise self.refuse_pods
        if manifest["kind"] == "Pod" and self.pod_faults:
            raise self.pod_faults.pop(0)
        if key in self.objects:
            raise Conflict(409, "already exists")
        obj = json.loads(json.dumps(manifest))
        obj["metadata"]["resourceVersion"] = str(len(self.objects) + 2)
        obj["metadata"]["uid"] = f"uid-{key[1]}"
        self.objects[key] = obj
        if manifest["kind"] == "Pod" and self.drop_after_create:
            self.drop_after_create -= 1
            raise TransportError("the connection was cut")
        return obj

    async def get_pod(self, name: str) -> dict[str, Any] | None:
        if self.get_error is not None:
            raise self.get_error
        return self.objects.get(("Pod", name))

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

    async def pod_log(self, name: str, container: str, tail_lines: int | None = None) -> str:
        self.logs_asked.append((name, container))
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
        await asyncio.wait_for(driver.follower.synced.wait(), 5)
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
    driver.follower.pods["klique-3-1"] = api.objects[("Pod", "klique-3-1")]
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
    ran = replace(task(TaskState.RUNNING), started_at=1.0)
    news = asyncio.run(polled(driver, [ran]))
    assert news[3].state is TaskState.LOST and "klique-3-1" in news[3].reason
    assert not news[3].retry


def test_a_submitted_task_whose_pod_never_came_goes_again(tmp_path):
    """After a restart a create that waited (quota) is forgotten: the task runs again."""
    driver, _ = make(tmp_path)
    driver.lost_after_s = 0
    news = asyncio.run(polled(driver, [task(TaskState.PENDING)]))
    assert news[3].state is TaskState.LOST and news[3].retry and "never came" in news[3].reason


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
                if driver.follower.error:
                    break
                await asyncio.sleep(0.01)
            return await driver.capacity([task()])
        finally:
            await driver.close()

    state = asyncio.run(look())
    assert not state.reachable and "connection refused" in state.reason


async def _looks(driver: KubernetesDriver, tasks: list[Task], times: int = 1) -> dict[int, Any]:
    """Start the watch, wait for its first list, then look `times` times; the last news."""
    await driver.poll(tasks)
    await asyncio.wait_for(driver.follower.synced.wait(), 5)
    news: dict[int, Any] = {}
    for _ in range(times):
        news = await driver.poll(tasks)
    return news


def test_the_secret_is_made_after_its_pod_and_owned_by_it(tmp_path):
    driver, api = make(tmp_path)
    asyncio.run(driver.submit(task(TaskState.PLACED), "t"))
    made = [key for key in api.creates if key[0] != "ConfigMap"]
    assert made == [("Pod", "klique-3-1"), ("Secret", "klique-3-1-task")]
    owners = api.objects[("Secret", "klique-3-1-task")]["metadata"]["ownerReferences"]
    assert owners == [
        {"apiVersion": "v1", "kind": "Pod", "name": "klique-3-1", "uid": "uid-klique-3-1"}
    ]


@pytest.mark.parametrize(
    "refusal",
    [
        KubeError(403, 'pods "klique-3-1" is forbidden: exceeded quota: q, requested: pods=1'),
        KubeError(429, "Too many requests, please try again later.", retry_after=5),
        KubeError(503, "the server is currently unable to handle the request"),
    ],
)
def test_a_create_refused_for_now_waits_with_the_reason_and_is_tried_again(tmp_path, refusal):
    driver, api = make(tmp_path)
    api.pod_faults = [refusal]

    async def go() -> tuple[Any, Any, Any]:
        try:
            done = await driver.submit(task(TaskState.PLACED), "t")
            waiting = await _looks(driver, [task(TaskState.SUBMITTED)])
            driver.creations.pending[3].next_at = 0  # its back-off is over
            made = await driver.poll([task(TaskState.SUBMITTED)])
            return done, waiting, made
        finally:
            await driver.close()

    done, waiting, made = asyncio.run(go())
    assert done.native_id == "klique-3-1"  # accepted: the task waits in the pool
    assert waiting[3].state is TaskState.PENDING
    assert refusal.message in waiting[3].reason and "next try in" in waiting[3].reason
    assert ("Pod", "klique-3-1") in api.objects and ("Secret", "klique-3-1-task") in api.objects
    assert made.get(3) is None or made[3].state is not TaskState.FAILED


def test_a_429_waits_as_long_as_its_retry_after_says(tmp_path):
    driver, api = make(tmp_path)
    api.pod_faults = [KubeError(429, "slow down", retry_after=17)]
    asyncio.run(driver.submit(task(TaskState.PLACED), "t"))
    assert "next try in 17 s" in driver.creations.pending[3].reason


def test_a_create_refused_for_good_fails_and_leaves_nothing(tmp_path):
    driver, api = make(tmp_path)
    api.pod_faults = [KubeError(403, 'pods "x" is forbidden: violates PodSecurity "restricted"')]
    with pytest.raises(KubeError, match="violates PodSecurity"):
        asyncio.run(driver.submit(task(TaskState.PLACED), "t"))
    assert [k for k in api.objects if k[0] != "ConfigMap"] == [] and driver.creations.pending == {}


def test_a_create_with_no_answer_is_looked_up_and_adopted_never_made_twice(tmp_path):
    driver, api = make(tmp_path)
    api.drop_after_create = 1  # made, then the connection is cut before the answer
    done = asyncio.run(driver.submit(task(TaskState.PLACED), "t"))
    assert done.native_id == "klique-3-1"
    assert api.creates.count(("Pod", "klique-3-1")) == 1  # looked up, not created again
    assert ("Secret", "klique-3-1-task") in api.objects


def test_a_create_with_no_answer_while_the_api_is_down_stays_placed_then_is_found(tmp_path):
    driver, api = make(tmp_path)
    api.drop_after_create = 1
    api.get_error = TransportError("connection refused")
    with pytest.raises(SubmitUnknown):
        asyncio.run(driver.submit(task(TaskState.PLACED), "t"))
    assert "no answer" in (driver.outcome_unknown(3) or "")
    api.get_error = None
    news = asyncio.run(polled(driver, [task(TaskState.PLACED)]))
    assert (news[3].state, news[3].native_id) == (TaskState.SUBMITTED, "klique-3-1")
    assert api.creates.count(("Pod", "klique-3-1")) == 1
    assert ("Secret", "klique-3-1-task") in api.objects


def test_a_retried_create_answered_409_for_this_attempts_pod_adopts_it(tmp_path):
    driver, api = make(tmp_path)
    first = asyncio.run(driver.submit(task(TaskState.PLACED), "t"))
    del api.objects[("Secret", "klique-3-1-task")]  # the crash came between the two
    again = asyncio.run(driver.submit(task(TaskState.PLACED), "t"))  # tried again
    assert first == again and ("Secret", "klique-3-1-task") in api.objects
    assert api.creates.count(("Pod", "klique-3-1")) == 2  # the second answered 409: adopted
    assert len([k for k in api.objects if k[0] == "Pod"]) == 1


def test_a_placed_task_whose_pod_never_started_is_made_again(tmp_path):
    driver, api = make(tmp_path)
    api.objects[("Pod", "klique-3-1")] = pod("klique-3-1", 3, "Pending")  # its Secret unknown
    news = asyncio.run(polled(driver, [task(TaskState.PLACED)]))
    assert news[3].state is TaskState.QUEUED and ("Pod", "klique-3-1") in api.deleted


def _disrupted(reason: str, phase: str = "Failed") -> dict[str, Any]:
    p = pod("klique-3-1", 3, phase, 143 if phase == "Failed" else None)
    condition = {"type": "DisruptionTarget", "status": "True", "reason": reason}
    p["status"]["conditions"] = [condition]
    return p


@pytest.mark.parametrize("reason", ["EvictionByEvictionAPI", "PreemptionByScheduler"])
def test_an_evicted_or_preempted_pod_requeues_its_task(tmp_path, reason):
    driver, api = make(tmp_path)
    api.objects[("Pod", "klique-3-1")] = _disrupted(reason)
    news = asyncio.run(polled(driver, [task(TaskState.RUNNING)]))
    assert news[3].state is TaskState.FAILED and news[3].retry and reason in news[3].reason


def test_a_disrupted_pod_deleted_before_its_end_was_seen_requeues_too(tmp_path):
    driver, _ = make(tmp_path)
    driver.follower.apply("DELETED", _disrupted("DeletionByTaintManager", "Running"))
    driver.follower.synced.set()
    driver.follower.follow = lambda: None  # type: ignore[method-assign]
    news = asyncio.run(driver.poll([task(TaskState.RUNNING)]))
    assert news[3].retry and "DeletionByTaintManager" in news[3].reason


def test_a_pool_that_does_not_requeue_disruptions_fails_the_task(tmp_path):
    driver, api = make(tmp_path)
    driver.settings = driver.settings.model_copy(update={"requeue_disrupted": False})
    api.objects[("Pod", "klique-3-1")] = _disrupted("EvictionByEvictionAPI")
    news = asyncio.run(polled(driver, [task(TaskState.RUNNING)]))
    assert news[3].state is TaskState.FAILED and not news[3].retry


def test_a_pod_on_a_lost_node_is_lost_and_requeued_a_bounded_number_of_times(tmp_path):
    driver, api = make(tmp_path)
    p = pod("klique-3-1", 3, "Running")
    p["metadata"]["deletionTimestamp"] = "2020-01-01T00:00:00Z"
    p["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "NodeNotReady"}]
    api.objects[("Pod", "klique-3-1")] = p
    news = asyncio.run(polled(driver, [task(TaskState.RUNNING)]))
    assert news[3].state is TaskState.LOST and news[3].retry
    assert "NodeNotReady" in news[3].reason
    driver, api = make(tmp_path)
    api.objects[("Pod", "klique-3-1")] = p
    last = replace(task(TaskState.RUNNING), attempts=3)
    news = asyncio.run(polled(driver, [last]))
    assert news[3].state is TaskState.LOST and not news[3].retry


def test_an_image_pull_back_off_fails_the_task_after_image_pull_backoff(tmp_path):
    """Timed from the first ImagePullBackOff, through the kubelet's retries (ErrImagePull);
    the pod, which never ends by itself, is deleted once the task's end is recorded."""
    driver, api = make(tmp_path)
    p = pod("klique-3-1", 3, "Pending")
    api.objects[("Pod", "klique-3-1")] = p

    def waiting(reason: str) -> None:
        state = {"waiting": {"reason": reason, "message": 'Back-off pulling image "nope:1"'}}
        p["status"]["containerStatuses"] = [{"name": "task", "state": state}]

    async def go() -> list[Any]:
        try:
            waiting("ErrImagePull")
            seen = [await _looks(driver, [task(TaskState.PENDING)])]
            assert 3 not in driver._pull_since  # the first try: no back-off yet
            waiting("ImagePullBackOff")
            seen.append(await driver.poll([task(TaskState.PENDING)]))
            waiting("ErrImagePull")  # the kubelet tries again: the clock runs on
            await driver.poll([task(TaskState.PENDING)])
            assert 3 in driver._pull_since
            driver._pull_since[3] -= 300  # as long as image_pull_backoff (5 min)
            seen.append(await driver.poll([task(TaskState.PENDING)]))
            await driver.poll([])  # its end recorded: no longer followed
            return seen
        finally:
            await driver.close()

    first, backing_off, given_up = asyncio.run(go())
    assert first[3].state is TaskState.PENDING and "ErrImagePull" in first[3].reason
    assert backing_off[3].state is TaskState.PENDING and "ImagePullBackOff" in backing_off[3].reason
    assert given_up[3].state is TaskState.FAILED and "nope:1" in given_up[3].reason
    assert ("Pod", "klique-3-1") in api.deleted


def test_the_log_is_asked_of_the_task_container_by_name(tmp_path):
    driver, api = make(tmp_path)
    api.objects[("Pod", "klique-1-1")] = pod("klique-1-1", 1, "Succeeded", 0)
    asyncio.run(polled(driver, []))
    assert api.logs_asked == [("klique-1-1", "task")]


PRIVILEGED = """
apiVersion: v1
kind: Pod
spec:
  hostNetwork: true
  containers:
    - name: shipper
      image: busybox
      securityContext: {capabilities: {add: [SYS_ADMIN]}}
"""


def test_a_template_that_adds_privileges_is_refused_with_the_field_named(tmp_path):
    (tmp_path / "templates" / "kubernetes").mkdir(parents=True)
    (tmp_path / "templates" / "kubernetes" / "pod.yaml").write_text(PRIVILEGED)
    text = ESTATE.replace("pools:\n", f"templates_dir: {tmp_path / 'templates'}\npools:\n")
    estate = parse_estate(text)
    context = Context(estate, tmp_path, tmp_path / "runner.pyz", "http://klique:8000")
    driver = KubernetesDriver(estate.pools["k8s"], context, api=MemoryApi())  # type: ignore[arg-type]
    problems = asyncio.run(driver.check())
    assert len(problems) == 2
    assert "pool k8s: pod template" in problems[0] and "spec.hostNetwork" in problems[0]
    assert "spec.containers[0].securityContext.capabilities.add" in problems[1]
    assert all("allow_privileged_templates: true" in p for p in problems)
    with pytest.raises(TemplateError, match="hostNetwork"):
        driver.render(task(TaskState.PLACED))
    allowed = parse_estate(
        text.replace(
            "installation: site", "installation: site\n    allow_privileged_templates: true"
        )
    )
    context = Context(allowed, tmp_path, tmp_path / "runner.pyz", "http://klique:8000")
    driver = KubernetesDriver(allowed.pools["k8s"], context, api=MemoryApi())  # type: ignore[arg-type]
    assert asyncio.run(driver.check()) == []
    assert driver.render(task(TaskState.PLACED))["spec"]["hostNetwork"] is True
