"""Kueue, as much of it as a Kubernetes pool with `admission: kueue` meets: suspended Jobs
labelled with a LocalQueue, a Workload for each, admitted from one ClusterQueue's quota (one
flavor), the Job unsuspended and its pod made once admitted, the quota freed when it ends.

After Kueue's documentation and code:
- A Job is Kueue's when created with `spec.suspend: true` and the label
  `kueue.x-k8s.io/queue-name` (https://kueue.sigs.k8s.io/docs/tasks/run/jobs/); Kueue makes a
  Workload for it, owned by the Job (https://kueue.sigs.k8s.io/docs/concepts/workload/), and
  unsuspends the Job once the Workload is admitted.
- The Workload's conditions (kueue.x-k8s.io/v1beta1 WorkloadStatus): `QuotaReserved` False with
  reason `Pending` while it waits, its message from the flavor assigner
  (kubernetes-sigs/kueue pkg/scheduler/flavorassigner/flavorassigner.go): "couldn't assign
  flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor
  default-flavor, 2 more needed"; `Admitted` False meanwhile; both True once admitted; and
  `Finished` True once the Job's pod has ended, which frees its quota.
- A ClusterQueue's nominal quota per resource and flavor (https://kueue.sigs.k8s.io/docs/
  concepts/cluster_queue/): here one ClusterQueue, `cluster-queue`, with one flavor,
  `default-flavor`, serving every LocalQueue; a Workload fits when its pod's requests plus what
  the admitted, unfinished Workloads hold stay within it (resources the quota does not name
  are not counted).

Not Kueue, under /emulator/ (the tests' lever): GET /emulator/kueue shows the quota and its
use; POST /emulator/kueue {"quota": {"nvidia.com/gpu": 4, "cpu": 8}} sets it (a quota raised or
freed: waiting Workloads are admitted at the next step).

Hooked in by main.py: `--kueue-quota RESOURCE=N` (repeatable) starts this model.
"""

from __future__ import annotations

import copy
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .kubelet import condition
from .store import KINDS, Kind, parse_quantity

KINDS["jobs"] = Kind("Job", "batch/v1")
KINDS["workloads"] = Kind("Workload", "kueue.x-k8s.io/v1beta1")

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
CLUSTER_QUEUE = "cluster-queue"
FLAVOR = "default-flavor"
POD_SET = "main"
ENDED = ("Succeeded", "Failed")


def requests_of(template: dict[str, Any]) -> dict[str, float]:
    """What the Job's pod asks for (requests, else limits), summed over its containers."""
    total: dict[str, float] = {}
    for container in (template.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for key, value in wanted.items():
            total[key] = total.get(key, 0.0) + parse_quantity(value)
    return total


def shown(resource: str, amount: float) -> str:
    """An amount as Kueue prints it: whole numbers plain, memory in Mi."""
    if resource == "memory" or resource.endswith(".memory"):
        return f"{amount / 2**20:g}Mi"
    return f"{amount:g}"


def shortfall(quota: dict[str, float], used: dict[str, float], wanted: dict[str, float]) -> str:
    """The flavor assigner's message for the first resource that does not fit ('' : fits)."""
    for resource in sorted(quota):
        need = used.get(resource, 0.0) + wanted.get(resource, 0.0)
        if need > quota[resource]:
            more = shown(resource, need - quota[resource])
            return (
                f"couldn't assign flavors to pod set {POD_SET}: insufficient unused quota for "
                f"{resource} in flavor {FLAVOR}, {more} more needed"
            )
    return ""


def has(workload: dict[str, Any], kind: str) -> bool:
    found = (workload.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in found)


def conditions_set(workload: dict[str, Any], *new: dict[str, Any]) -> None:
    status = workload.setdefault("status", {})
    kinds = {c["type"] for c in new}
    kept = [c for c in status.get("conditions") or [] if c.get("type") not in kinds]
    status["conditions"] = [*kept, *new]


class Kueue:
    """One ClusterQueue with one flavor, admitting the Workloads of queued Jobs in order."""

    def __init__(self, quota: dict[str, float]) -> None:
        self.quota = dict(quota)
        self.used_by_admitted: dict[str, float] = {}  # at the last step: what the lever shows

    def routes(self) -> list[Route]:
        return [Route("/emulator/kueue", self.lever, methods=["GET", "POST"])]

    async def lever(self, request: Request) -> Response:
        if request.method == "POST":
            body = await request.json()
            self.quota = {k: parse_quantity(v) for k, v in (body.get("quota") or {}).items()}
        return JSONResponse({"quota": self.quota, "used": self.used_by_admitted})

    async def step(self, cluster: Any) -> None:
        """One pass of Kueue's controllers: a Workload for each new queued Job, Finished for
        those whose pod ended, then admission in creation order while the quota holds."""
        store = cluster.store
        jobs = [
            (ns, job)
            for (ns, plural, _), job in sorted(
                store.objects.items(), key=lambda kv: int(kv[1]["metadata"]["resourceVersion"])
            )
            if plural == "jobs" and QUEUE_LABEL in (job["metadata"].get("labels") or {})
        ]
        waiting = []
        used: dict[str, float] = {}
        for ns, job in jobs:
            workload = self.workload_of(store, ns, job) or await self.make_workload(store, ns, job)
            if has(workload, "Admitted") and not has(workload, "Finished"):
                if self.ended(store, ns, job):
                    await self.finish(store, ns, workload)
                    continue
                for key, value in requests_of(job["spec"]["template"]).items():
                    used[key] = used.get(key, 0.0) + value
            elif not has(workload, "Admitted"):
                waiting.append((ns, job, workload))
        for ns, job, workload in waiting:
            wanted = requests_of(job["spec"]["template"])
            message = shortfall(self.quota, used, wanted)
            if message:
                await self.wait(store, ns, workload, message)
                continue
            for key, value in wanted.items():
                used[key] = used.get(key, 0.0) + value
            await self.admit(cluster, ns, job, workload)
        self.used_by_admitted = {k: v for k, v in used.items() if k in self.quota}

    def workload_of(self, store: Any, ns: str, job: dict[str, Any]) -> dict[str, Any] | None:
        uid = job["metadata"]["uid"]
        for (n, plural, _), obj in store.objects.items():
            owners = obj["metadata"].get("ownerReferences") or []
            if n == ns and plural == "workloads" and any(o.get("uid") == uid for o in owners):
                return obj
        return None

    async def make_workload(self, store: Any, ns: str, job: dict[str, Any]) -> dict[str, Any]:
        meta = job["metadata"]
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"]}
        workload = store.stamp(
            ns,
            "workloads",
            {
                "metadata": {
                    "name": f"job-{meta['name']}-{meta['uid'][:5]}",
                    "labels": {"kueue.x-k8s.io/job-uid": meta["uid"]},
                    "ownerReferences": [{**owner, "controller": True}],
                },
                "spec": {
                    "queueName": meta["labels"][QUEUE_LABEL],
                    "podSets": [{"name": POD_SET, "count": 1, "template": job["spec"]["template"]}],
                },
                "status": {},
            },
        )
        return await store.write(ns, "workloads", "ADDED", workload)

    async def wait(self, store: Any, ns: str, workload: dict[str, Any], message: str) -> None:
        reserved = condition("QuotaReserved", False, "Pending", message)
        admitted = condition("Admitted", False, "NoReservation", "The workload has no reservation")
        now = (workload.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "QuotaReserved" and c.get("message") == message for c in now):
            return  # said already: no write, no watch event

        def edit(w: dict[str, Any]) -> None:
            conditions_set(w, reserved, admitted)

        await store.change(ns, "workloads", workload["metadata"]["name"], edit)

    async def admit(
        self, cluster: Any, ns: str, job: dict[str, Any], workload: dict[str, Any]
    ) -> None:
        """Admitted: the Workload's conditions, the Job unsuspended, its pod made (as the Job
        controller makes it: named after the Job, labelled with it, owned by it)."""
        store = cluster.store

        def admitted(w: dict[str, Any]) -> None:
            conditions_set(
                w,
                condition(
                    "QuotaReserved",
                    True,
                    "QuotaReserved",
                    f"Quota reserved in ClusterQueue {CLUSTER_QUEUE}",
                ),  # fmt: skip
                condition("Admitted", True, "Admitted", "The workload is admitted"),
            )
            w["status"]["admission"] = {
                "clusterQueue": CLUSTER_QUEUE,
                "podSetAssignments": [
                    {"name": POD_SET, "flavors": dict.fromkeys(self.quota, FLAVOR)}
                ],  # fmt: skip
            }

        await store.change(ns, "workloads", workload["metadata"]["name"], admitted)

        def unsuspend(j: dict[str, Any]) -> None:
            j["spec"]["suspend"] = False
            j["status"] = {"active": 1, "startTime": j["metadata"]["creationTimestamp"]}

        await store.change(ns, "jobs", job["metadata"]["name"], unsuspend)
        await cluster.create(ns, "pods", self.pod_of(job))

    def pod_of(self, job: dict[str, Any]) -> dict[str, Any]:
        meta = job["metadata"]
        template = copy.deepcopy(job["spec"]["template"])
        labels = {**(template.get("metadata") or {}).get("labels", {})}
        labels.update(dict.fromkeys(JOB_NAME_LABELS, meta["name"]))
        labels["batch.kubernetes.io/controller-uid"] = meta["uid"]
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"]}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{meta['name']}-{meta['uid'][:5]}",
                "labels": labels,
                "annotations": (template.get("metadata") or {}).get("annotations") or {},
                "ownerReferences": [{**owner, "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": template["spec"],
        }

    def ended(self, store: Any, ns: str, job: dict[str, Any]) -> bool:
        """The Job's pod ended, or is gone (deleted), once admitted."""
        uid = job["metadata"]["uid"]
        for (n, plural, _), pod in store.objects.items():
            owners = pod["metadata"].get("ownerReferences") or []
            if n == ns and plural == "pods" and any(o.get("uid") == uid for o in owners):
                return (pod.get("status") or {}).get("phase") in ENDED
        return True

    async def finish(self, store: Any, ns: str, workload: dict[str, Any]) -> None:
        def edit(w: dict[str, Any]) -> None:
            conditions_set(w, condition("Finished", True, "JobFinished", "Job finished"))

        await store.change(ns, "workloads", workload["metadata"]["name"], edit)


def from_args(quota: list[str]) -> Kueue | None:
    """The model for main.py's `--kueue-quota RESOURCE=N` arguments (None: none given)."""
    if not quota:
        return None
    parsed = {}
    for item in quota:
        key, _, value = item.partition("=")
        parsed[key] = parse_quantity(value)
    return Kueue(parsed)
