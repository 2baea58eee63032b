"""A Kubernetes pool that hands admission to Kueue: the suspended Job it makes, and Kueue's
words in `klique why` while the Workload waits (against an in-memory API)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from typing import Any

import httpx
from conftest import ROOT, free_port, wait_for
from fakes._kubesim.kueue import Kueue
from fakes._kubesim.store import Store
from test_kube_driver import ESTATE, MemoryApi, polled, task

from broker.domain import TaskState
from broker.estate import parse_estate
from broker.pools import kueue
from broker.pools.base import Context
from broker.pools.kubernetes import KubernetesDriver

KUEUE = ESTATE + "    admission: kueue\n    local_queue: team-a\n"
MESSAGE = (
    "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in flavor "
    "default-flavor, 2 more needed"
)


class KueueApi(MemoryApi):
    def __init__(self) -> None:
        super().__init__()
        self.workloads: list[dict[str, Any]] = []

    async def get_job(self, name: str) -> dict[str, Any] | None:
        return self.objects.get(("Job", name))

    async def list_workloads(self) -> list[dict[str, Any]]:
        return self.workloads


def make(tmp_path) -> tuple[KubernetesDriver, KueueApi]:
    estate = parse_estate(KUEUE)
    (tmp_path / "runner.pyz").write_bytes(b"PK")
    api = KueueApi()
    context = Context(estate, tmp_path, tmp_path / "runner.pyz", "http://klique:8000")
    return KubernetesDriver(estate.pools["k8s"], context, api=api), api  # type: ignore[arg-type]


def workload(job: str, condition: str, status: str, message: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"job-{job}-1a2b3", "ownerReferences": [{"kind": "Job", "name": job}]},
        "status": {"conditions": [{"type": condition, "status": status, "message": message}]},
    }


def test_a_kueue_pool_makes_a_suspended_job_labelled_with_its_queue(tmp_path):
    driver, api = make(tmp_path)
    asyncio.run(driver.submit(task(TaskState.PLACED), "t"))
    job = api.objects[("Job", "klique-3-1")]
    assert job["spec"]["suspend"] is True and job["spec"]["backoffLimit"] == 0
    assert job["metadata"]["labels"][kueue.QUEUE_LABEL] == "team-a"
    pod_spec = job["spec"]["template"]["spec"]
    assert [c["name"] for c in pod_spec["containers"]] == ["task"]
    assert pod_spec["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert job["spec"]["template"]["metadata"]["labels"]["klique.dev/task"] == "3"
    assert ("Pod", "klique-3-1") not in api.objects
    [owner] = api.objects[("Secret", "klique-3-1-task")]["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("Job", "klique-3-1")


def test_why_shows_kueues_words_while_the_workload_waits(tmp_path):
    driver, api = make(tmp_path)
    api.workloads = [workload("klique-3-1", "QuotaReserved", "False", MESSAGE)]
    news = asyncio.run(polled(driver, [task(TaskState.SUBMITTED)]))
    assert news[3].state is TaskState.PENDING and news[3].reason == f"Kueue: {MESSAGE}"


def test_a_jobs_pod_is_followed_by_its_jobs_name(tmp_path):
    driver, api = make(tmp_path)
    pod = {
        "metadata": {
            "name": "klique-3-1-x7k2p",
            "labels": {"klique.dev/task": "3", "batch.kubernetes.io/job-name": "klique-3-1"},
            "resourceVersion": "5",
        },
        "status": {"phase": "Running"},
    }
    api.objects[("Pod", "klique-3-1-x7k2p")] = pod
    news = asyncio.run(polled(driver, [task(TaskState.SUBMITTED)]))
    assert news[3].state is TaskState.RUNNING


def test_an_admitted_workload_says_nothing():
    admitted = workload("j", "Admitted", "True", "")
    assert kueue.waiting(admitted) is None
    assert kueue.waiting(workload("j", "QuotaReserved", "False", MESSAGE)) == f"Kueue: {MESSAGE}"


class Cluster:
    """What the emulator's Kueue model uses of the cluster: its store, and creates."""

    def __init__(self) -> None:
        self.store = Store(1000)

    async def create(self, ns: str, plural: str, obj: dict[str, Any]) -> tuple[int, Any]:
        obj = self.store.stamp(ns, plural, obj)
        if plural == "pods":
            obj["status"] = {"phase": "Pending"}
        return 201, await self.store.write(ns, plural, "ADDED", obj)


def _queued_job(name: str, gpus: int) -> dict[str, Any]:
    pod = {
        "metadata": {"name": name, "labels": {"klique.dev/task": name}},
        "spec": {
            "containers": [{"name": "task", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]
        },
    }
    return kueue.job_manifest(pod, "team-a")


def test_the_emulators_kueue_admits_from_its_quota_and_says_why_it_waits():
    async def go() -> None:
        cluster = Cluster()
        model = Kueue({"nvidia.com/gpu": 2})
        await cluster.create("klique", "jobs", _queued_job("a", 2))
        await cluster.create("klique", "jobs", _queued_job("b", 2))
        await model.step(cluster)
        objects = cluster.store.objects
        [wa, wb] = [o for (_, p, _), o in sorted(objects.items()) if p == "workloads"]
        assert kueue.owner_job(wa) == "a" and kueue.waiting(wa) is None
        assert kueue.waiting(wb) == (
            "Kueue: couldn't assign flavors to pod set main: insufficient unused quota for "
            "nvidia.com/gpu in flavor default-flavor, 2 more needed"
        )
        assert objects[("klique", "jobs", "a")]["spec"]["suspend"] is False
        assert objects[("klique", "jobs", "b")]["spec"]["suspend"] is True
        [pod] = [o for (_, p, _), o in objects.items() if p == "pods"]
        assert kueue.job_of(pod) == "a" and pod["metadata"]["labels"]["klique.dev/task"] == "a"
        pod["status"]["phase"] = "Succeeded"  # a's pod ends: its quota is free
        await model.step(cluster)
        await model.step(cluster)
        assert objects[("klique", "jobs", "b")]["spec"]["suspend"] is False

    asyncio.run(go())


def test_a_kueue_pool_against_the_emulator_waits_with_kueues_words_then_runs(tmp_path):
    """Through the real API client: the suspended Job, Kueue's words while its quota is short,
    the Job's pod followed once Kueue admits it, and nothing left after a cancel."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, str(ROOT / "tests" / "fakes" / "kubernetes" / "kube-emulator")]
    argv += ["--port", str(port), "--state", str(tmp_path / "state"), "--namespace", "klique"]
    argv += ["--resource", "nvidia.com/gpu=4", "--kueue-quota", "nvidia.com/gpu=1"]
    emulator = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up() -> bool:
        try:
            return httpx.get(f"{url}/api/v1/namespaces/klique/pods", timeout=1).is_success
        except httpx.TransportError:
            return False

    def count(path: str) -> int:
        return len(httpx.get(f"{url}/{path}").json()["items"])

    estate = parse_estate(
        KUEUE.replace("http://127.0.0.1:1", url).replace("memory: 1G,", "memory: 1G, gpus: 2,")
    )
    (tmp_path / "runner.pyz").write_bytes(b"PK")
    context = Context(estate, tmp_path, tmp_path / "runner.pyz", "http://klique:8000")
    driver = KubernetesDriver(estate.pools["k8s"], context)

    async def until(tasks: list[Any], test: Any) -> Any:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            news = await driver.poll(tasks)
            if 3 in news and test(news[3]):
                return news[3]
            await asyncio.sleep(0.2)
        raise AssertionError("no such news within 20 s")

    async def go() -> None:
        try:
            await driver.submit(task(TaskState.PLACED), "t")
            submitted = [task(TaskState.SUBMITTED)]
            waiting = await until(submitted, lambda seen: seen.reason.startswith("Kueue:"))
            assert "insufficient unused quota for nvidia.com/gpu" in waiting.reason
            httpx.post(f"{url}/emulator/kueue", json={"quota": {"nvidia.com/gpu": 2}})
            admitted = await until(submitted, lambda seen: not seen.reason.startswith("Kueue"))
            assert admitted.state is TaskState.PENDING  # its pod, made by the Job: followed
            await driver.cancel(submitted[0])
        finally:
            await driver.close()

    try:
        wait_for(up, 30, "the Kubernetes API emulator to answer")
        asyncio.run(go())
        wait_for(
            lambda: (
                count("apis/batch/v1/namespaces/klique/jobs")
                + count("api/v1/namespaces/klique/pods")
                + count("api/v1/namespaces/klique/secrets")
                == 0
            ),
            10,
            "the Job, its pod and its Secret to go",
        )
    finally:
        emulator.terminate()
        emulator.wait(10)
