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
- The termination message: the runner's exit record, which the kubelet copies from the
  container's terminationMessagePath (https://kubernetes.io/docs/tasks/debug/debug-application/
  determine-reason-pod-failure/#customizing-the-termination-message).
- Image pulls: the kubelet retries a failed pull itself, ErrImagePull then ImagePullBackOff with
  a back-off doubling from 10 s to 300 s (https://kubernetes.io/docs/concepts/containers/images/
  #imagepullbackoff): only a back-off that lasts fails the task.
- Disruptions: condition DisruptionTarget=True with its reason (https://kubernetes.io/docs/
  concepts/workloads/pods/disruptions/#pod-disruption-conditions), and the kubelet's node-pressure
  eviction (phase Failed, reason Evicted): the task goes back to Klique's queue, as a batch pool's
  preempted job does.
- Node loss: a pod whose node stopped answering keeps its deletionTimestamp and stays Terminating
  (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination); past its
  grace with Ready=False, or Terminating beyond a bound, the task is lost.
- Refused creates: a quota's 403 ("exceeded quota", https://kubernetes.io/docs/concepts/policy/
  resource-quotas/), 429 (API Priority and Fairness, with Retry-After: https://kubernetes.io/docs/
  concepts/cluster-administration/flow-control/) and 5xx are waits, retried with back-off.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
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
    "InvalidImageName": "the image name is not valid",
    "ErrImageNeverPull": "the image is not on the node and its pull policy is Never",
    "CreateContainerConfigError": "the container's configuration is wrong",
    "CreateContainerError": "the container could not be created",
}

# Waiting reasons of a pull the kubelet retries: the task waits, until the back-off has lasted
# the pool's image_pull_backoff.
PULL_WAITING: Mapping[str, str] = {
    "ErrImagePull": "the image could not be pulled; the kubelet tries again",
    "ImagePullBackOff": "the image could not be pulled; the kubelet backs off and tries again",
}
PULL_BACKOFF = "ImagePullBackOff"

# DisruptionTarget reasons: the pod was stopped for the cluster's sake, not the task's.
DISRUPTIONS: Mapping[str, str] = {
    "EvictionByEvictionAPI": "evicted through the Eviction API (a node drain)",
    "PreemptionByScheduler": "preempted by the Kubernetes scheduler for a pod of higher priority",
    "DeletionByTaintManager": "deleted by the taint manager (its node is tainted NoExecute)",
    "TerminationByKubelet": "terminated by the kubelet (node pressure or a node shutdown)",
}
EVICTED = "Evicted"  # a pod's reason after the kubelet's node-pressure eviction

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


def condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for found in (pod.get("status") or {}).get("conditions") or []:
        if found.get("type") == kind:
            return dict(found)
    return None


def disruption(pod: Mapping[str, Any]) -> str | None:
    """Why the cluster stopped this pod (DisruptionTarget, or the kubelet's eviction), or None."""
    target = condition(pod, "DisruptionTarget")
    if target is not None and target.get("status") == "True":
        reason = str(target.get("reason") or "")
        words = DISRUPTIONS.get(reason, "stopped by the cluster")
        return f"{reason or 'DisruptionTarget'}: {words}"
    status = pod.get("status") or {}
    if status.get("reason") == EVICTED:
        return f"{EVICTED}: {status.get('message') or 'evicted by the kubelet'}"
    return None


def disrupted(pod: Mapping[str, Any], seen: Observation | None, gone: bool) -> Observation | None:
    """A disrupted pod that has ended (or is gone): the task goes back to Klique's queue, unless
    it completed first. None: not disrupted, or still running out its grace."""
    why = disruption(pod)
    if why is None or (seen is not None and seen.state is TaskState.COMPLETED):
        return None
    if not gone and (seen is None or not seen.state.final):
        return None
    code = seen.exit_code if seen is not None else None
    return Observation(TaskState.FAILED, why, code, preempted=True, retry=True)


def timestamp(value: object) -> float | None:
    """An RFC 3339 time of the API (`2026-01-02T03:04:05Z`) as a Unix time, or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def node_lost(pod: Mapping[str, Any], now: float, stuck_s: float) -> str | None:
    """Why this pod's node is taken as lost, or None. A deleted pod's deletionTimestamp is when
    its grace ends: past it with Ready=False (the node controller's mark of a node that stopped
    answering), or Terminating `stuck_s` past it, nothing on the node confirms the end."""
    deadline = timestamp((pod.get("metadata") or {}).get("deletionTimestamp"))
    if deadline is None or now < deadline:
        return None
    seen = observe(pod)
    if seen is not None and seen.state.final:
        return None  # its end is known: the kubelet answered
    ready = condition(pod, "Ready")
    if ready is not None and ready.get("status") == "False":
        words = str(ready.get("reason") or ready.get("message") or "Ready=False")
        return f"its node stopped answering ({words}) and the pod is past its grace"
    if now - deadline >= stuck_s:
        return f"its pod has been terminating for {now - deadline:.0f} s past its grace"
    return None


def pulling(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, the runtime's message) while the kubelet retries pulling the image, or None.
    The kubelet alternates ErrImagePull (a try) and ImagePullBackOff (the wait before the
    next): the back-off lasts from the first ImagePullBackOff until the container leaves
    both."""
    waiting = (runner_status(pod).get("state") or {}).get("waiting") or {}
    reason = str(waiting.get("reason") or "")
    if reason not in PULL_WAITING:
        return None
    return reason, str(waiting.get("message") or "")


def pull_given_up(message: str, backoff_s: float, limit_s: float) -> Observation | None:
    """An image pull backed off for `limit_s`: the task fails (None: it waits still)."""
    if backoff_s < limit_s:
        return None
    words = f"{PULL_BACKOFF}: the image could not be pulled for {backoff_s:.0f} s"
    return Observation(TaskState.FAILED, f"{words}: {message}".rstrip(": "))


def create_wait(code: int, message: str) -> str | None:
    """A refused create that is a wait, in the pool's words, or None (a refusal that stays)."""
    if code == 403 and "exceeded quota" in message:
        return f"the namespace's quota is used up: {message}"
    if code == 429:
        return f"the API server asks Klique to slow down: {message}"
    if 500 <= code < 600:
        return f"the API server failed (HTTP {code}): {message}"
    return None


def retry_delay(failures: int, retry_after: float | None, first_s: float, most_s: float) -> float:
    """Seconds before the next create after `failures` refusals in a row: the server's
    Retry-After where it gave one, else a back-off doubling from first_s to most_s."""
    if retry_after is not None and retry_after >= 0:
        return min(retry_after, most_s)
    return min(first_s * 2 ** max(failures - 1, 0), most_s)


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
    if reason in PULL_WAITING and phase == "Pending":
        words = str(waiting.get("message") or "")
        return Observation(
            TaskState.PENDING, f"{reason}: {PULL_WAITING[reason]}: {words}".rstrip(": ")
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
