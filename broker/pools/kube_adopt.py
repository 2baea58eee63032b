"""Adoption after a restart in a Kubernetes pool: a placed task whose submission was never
recorded (the server stopped between the create and the record) is found by its pod's name,
which derives from the task and the attempt (docs/kubernetes.md, "Failures").
"""

from __future__ import annotations

from typing import Any

from broker.domain import Task, TaskState
from broker.execution import Observation
from broker.pools import kube_states
from broker.pools.kube_api import KubeApi


async def adopt(
    api: KubeApi, task: Task, name: str, pod: dict[str, Any] | None, kind: str
) -> Observation:
    """A pod that runs is adopted; one that never started may lack its Secret (made after
    the pod), so it is deleted (as `kind`: Pod, or the Job holding it) and the task goes
    again; none: made again. A Kueue Job with no pod may wait in Kueue, never to be found
    by a pod: it goes too."""
    if pod is None:
        if kind == "Job":
            await api.delete("Job", name, grace_s=0)
        return Observation(TaskState.QUEUED, "its pod was never created; creating it again")
    seen = kube_states.observe(pod)
    if seen is not None and seen.state is TaskState.PENDING:
        await api.delete(kind, name, grace_s=0)
        return Observation(
            TaskState.QUEUED,
            f"its pod {name} never started and may lack its Secret; made again",
        )
    return Observation(TaskState.SUBMITTED, native_id=name, job_dir=task.job_dir)
