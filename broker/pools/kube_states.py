"""What a pod's status says of its task: one literal table per part of the status, each citing
the Kubernetes documentation, and `observe`, which reads a pod (a dict, as the API returns it).

- Pod phase: https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-phase
- Container states: https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#container-states
- Waiting reasons of a container that will not start (kubelet: pkg/kubelet/images/types.go,
  pkg/kubelet/container/sync_result.go): the image cannot be pulled, or its config is wrong.
- activeDeadlineSeconds: the kubelet fails the pod with reason DeadlineExceeded
  (https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#lifecycle).
- Unschedulable: condition PodScheduled=False, reason Unschedulable, with the scheduler's message
  (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-conditions).
- The termination message: the runner's exit.json, which the kubelet copies from the container's
  terminationMessagePath (https://kubernetes.io/docs/tasks/debug/debug-application/
  determine-reason-pod-failure/#customizing-the-termination-message).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.domain import TaskState
from broker.execution import Observation
from broker.pools.base import observation_from_exit, parse_json
from broker.pools.kube_pod import RUNNER_CONTAINER

# Phase -> task state. Unknown: the node stopped answering; no news (the driver names it lost
# when it lasts).
PHASES: Mapping[str, TaskState | None] = {
    "Pending": TaskState.PENDING,
    "Running": TaskState.RUNNING,
    "Succeeded": TaskState.COMPLETED,
    "Failed": TaskState.FAILED,
    "Unknown": None,
}

# Waiting reasons that end the task: the container will never start as it is.
FAILS_WAITING: Mapping[str, str] = {
    "ErrImagePull": "the image could not be pulled",
    "ImagePullBackOff": "the image could not be pulled",
    "InvalidImageName": "the image name is not valid",
    "ErrImageNeverPull": "the image is not on the node and its pull policy is Never",
    "CreateContainerConfigError": "the container's configuration is wrong",
    "CreateContainerError": "the container could not be created",
}

# Terminated reasons and pod reasons with their own words.
OOM_KILLED = "OOMKilled"
DEADLINE_EXCEEDED = "DeadlineExceeded"
UNSCHEDULABLE = "Unschedulable"


def runner_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if status.get("name") == RUNNER_CONTAINER:
            return dict(status)
    return {}


def unschedulable(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's message for a pod it cannot place, or None."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == UNSCHEDULABLE
        ):
            return str(condition.get("message") or "no node fits the pod")
    return None


def observe(pod: Mapping[str, Any]) -> Observation | None:
    """The task's state as this pod shows it (None: no news the table can give)."""
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    if status.get("reason") == DEADLINE_EXCEEDED:
        deadline = (pod.get("spec") or {}).get("activeDeadlineSeconds")
        return Observation(
            TaskState.TIMEOUT, f"ran past its walltime (activeDeadlineSeconds {deadline})"
        )
    container = runner_status(pod)
    state = container.get("state") or {}
    if state.get("terminated"):
        return _terminated(state["terminated"], phase)
    waiting = state.get("waiting") or {}
    reason = str(waiting.get("reason") or "")
    if reason in FAILS_WAITING:
        words = str(waiting.get("message") or "")
        return Observation(
            TaskState.FAILED, f"{reason}: {FAILS_WAITING[reason]}: {words}".rstrip(": ")
        )
    known = PHASES.get(phase)
    if known is None:
        return None
    if known is TaskState.PENDING:
        message = unschedulable(pod)
        if message is not None:
            return Observation(TaskState.PENDING, f"{UNSCHEDULABLE}: {message}")
        return Observation(TaskState.PENDING, reason or str(status.get("message") or ""))
    if known.final:  # a phase that ended with no container status: the pod's own words
        return Observation(known, str(status.get("message") or status.get("reason") or phase))
    return Observation(known)


def _terminated(terminated: Mapping[str, Any], phase: str) -> Observation:
    code = terminated.get("exitCode")
    code = code if type(code) is int else None
    reason = str(terminated.get("reason") or "")
    if reason == OOM_KILLED:
        return Observation(
            TaskState.FAILED, "OOMKilled: the task used more memory than its limit", code
        )
    message = terminated.get("message")
    claim = parse_json(message.encode()) if isinstance(message, str) else None
    if claim is not None:
        seen = observation_from_exit(claim)
        # The exit code is the kubelet's, not the runner's claim; a claim of success from a
        # container that failed is not believed.
        if seen.state is TaskState.COMPLETED and code not in (0, None):
            return Observation(TaskState.FAILED, f"exit code {code}", code)
        return Observation(
            seen.state,
            seen.reason,
            code if code is not None else seen.exit_code,
            preempted=seen.preempted,
        )
    if code == 0:
        return Observation(TaskState.COMPLETED, "exit code 0", 0)
    words = f"exit code {code}" + (f" ({reason})" if reason and reason != "Error" else "")
    return Observation(TaskState.FAILED, words, code)
