"""Kueue's part of a Kubernetes pool with `admission: kueue`: the suspended Job that holds a
task's pod, and Kueue's words while its Workload waits. Pure: dicts in, dicts out.

Kueue admits a `batch/v1` Job created with `spec.suspend: true` and the label
`kueue.x-k8s.io/queue-name` naming a LocalQueue (https://kueue.sigs.k8s.io/docs/tasks/
run/jobs/): it makes a Workload for the Job (ownerReferences: the Job), reserves quota for it in
the ClusterQueue behind that LocalQueue, and unsuspends the Job once admitted. While it waits,
the Workload's conditions say why (https://kueue.sigs.k8s.io/docs/concepts/workload/
#status): `QuotaReserved` False with reason `Pending` and a message such as "couldn't assign
flavors to pod set main: insufficient quota for nvidia.com/gpu in flavor default-flavor, 2 more
needed", then `Admitted` True.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")  # on a Job's pods
WAITING_CONDITIONS = ("QuotaReserved", "Admitted")


def job_manifest(pod: Mapping[str, Any], local_queue: str) -> dict[str, Any]:
    """The suspended Job that holds `pod` (as kube_pod renders it) for Kueue to admit: one
    pod, never retried by the Job (Klique decides what runs again), named as the pod is."""
    metadata = pod.get("metadata") or {}
    labels = {**(metadata.get("labels") or {}), QUEUE_LABEL: local_queue}
    template_metadata = {"labels": dict(metadata.get("labels") or {})}
    if metadata.get("annotations"):
        template_metadata["annotations"] = dict(metadata["annotations"])
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": metadata["name"], "labels": labels},
        "spec": {
            "suspend": True,
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 0,
            "template": {"metadata": template_metadata, "spec": copy.deepcopy(pod["spec"])},
        },
    }


def job_of(pod: Mapping[str, Any]) -> str | None:
    """The Job a pod belongs to (the Job controller's label), or None."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    for label in JOB_NAME_LABELS:
        if labels.get(label):
            return str(labels[label])
    return None


def owner_job(workload: Mapping[str, Any]) -> str | None:
    """The name of the Job a Workload was made for, or None."""
    for owner in (workload.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("kind") == "Job":
            return str(owner.get("name"))
    return None


def waiting(workload: Mapping[str, Any]) -> str | None:
    """Kueue's words while the Workload waits (a waiting condition False with a message), or
    None once it is admitted or says nothing."""
    conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    admitted = conditions.get("Admitted")
    if admitted is not None and admitted.get("status") == "True":
        return None
    for kind in WAITING_CONDITIONS:
        condition = conditions.get(kind)
        if condition is not None and condition.get("status") == "False":
            message = str(condition.get("message") or condition.get("reason") or "")
            return f"Kueue: {message}" if message else None
    return None
