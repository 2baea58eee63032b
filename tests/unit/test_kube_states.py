"""The pure rules of kube_states.py: which pod condition means what for the task (disruption,
node loss, image pull back-off, refused creates and their back-off)."""

from __future__ import annotations

from typing import Any

import pytest

from broker.domain import TaskState
from broker.pools import kube_states
from broker.pools.kube_states import observe

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def _pod(phase: str = "Running", **status: Any) -> dict[str, Any]:
    metadata = status.pop("metadata", {})
    return {"metadata": {"name": "klique-3-1", **metadata}, "status": {"phase": phase, **status}}


def _terminated(code: int) -> list[dict[str, Any]]:
    return [{"name": "task", "state": {"terminated": {"exitCode": code, "reason": "Error"}}}]


def _target(reason: str) -> dict[str, Any]:
    return {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": "m"}


def _rfc3339(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize("reason", sorted(kube_states.DISRUPTIONS))
def test_a_disrupted_pod_that_ended_goes_back_to_the_queue(reason):
    pod = _pod("Failed", conditions=[_target(reason)], containerStatuses=_terminated(143))
    seen = kube_states.disrupted(pod, observe(pod), gone=False)
    assert seen is not None and seen.state is TaskState.FAILED
    assert seen.retry and seen.preempted and seen.reason.startswith(reason)
    assert seen.exit_code == 143


def test_a_disrupted_pod_still_in_its_grace_is_no_news_and_a_completed_one_stays_completed():
    running = _pod("Running", conditions=[_target("EvictionByEvictionAPI")])
    assert kube_states.disrupted(running, observe(running), gone=False) is None
    assert kube_states.disrupted(running, observe(running), gone=True) is not None  # deleted
    done = _pod("Succeeded", conditions=[_target("PreemptionByScheduler")])
    done["status"]["containerStatuses"] = [
        {"name": "task", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
    ]
    assert kube_states.disrupted(done, observe(done), gone=False) is None
    plain = _pod("Failed", containerStatuses=_terminated(1))
    assert kube_states.disrupted(plain, observe(plain), gone=True) is None  # not disrupted


def test_the_kubelets_own_eviction_is_a_disruption():
    pod = _pod("Failed", reason="Evicted", message="The node was low on resource: memory.")
    seen = kube_states.disrupted(pod, observe(pod), gone=False)
    assert seen is not None and seen.retry and "low on resource" in seen.reason


def test_a_node_that_stopped_answering_loses_the_pod_only_past_its_grace():
    ready_false = {"type": "Ready", "status": "False", "reason": "NodeNotReady"}
    pod = _pod(
        "Running",
        conditions=[ready_false, _target("DeletionByTaintManager")],
        metadata={"deletionTimestamp": _rfc3339(NOW + 30)},
    )
    assert kube_states.node_lost(pod, NOW, stuck_s=120) is None  # in its grace still
    words = kube_states.node_lost(pod, NOW + 31, stuck_s=120)
    assert words is not None and "NodeNotReady" in words


def test_a_pod_stuck_terminating_is_lost_after_the_bound_and_one_that_ended_is_not():
    pod = _pod("Running", metadata={"deletionTimestamp": _rfc3339(NOW)})
    assert kube_states.node_lost(pod, NOW + 60, stuck_s=120) is None
    words = kube_states.node_lost(pod, NOW + 121, stuck_s=120)
    assert words is not None and "terminating for 121 s" in words
    ended = _pod("Failed", containerStatuses=_terminated(137), metadata=pod["metadata"])
    assert kube_states.node_lost(ended, NOW + 600, stuck_s=120) is None
    assert kube_states.node_lost(_pod("Running"), NOW, stuck_s=0) is None  # not deleted


def test_an_image_pull_fails_the_task_only_after_its_back_off_lasted():
    waiting = {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope"'}
    pod = _pod("Pending", containerStatuses=[{"name": "task", "state": {"waiting": waiting}}])
    assert kube_states.pulling(pod) == ("ImagePullBackOff", 'Back-off pulling image "nope"')
    message = 'Back-off pulling image "nope"'
    assert kube_states.pull_given_up(message, 299, 300) is None
    failed = kube_states.pull_given_up(message, 300, 300)
    assert failed is not None and failed.state is TaskState.FAILED
    assert failed.reason.startswith("ImagePullBackOff") and "nope" in failed.reason
    pulling = {"reason": "ErrImagePull", "message": "x"}
    first = _pod("Pending", containerStatuses=[{"name": "task", "state": {"waiting": pulling}}])
    assert kube_states.pulling(first) == ("ErrImagePull", "x")
    assert kube_states.pulling(_pod("Running")) is None


def test_quota_throttling_and_server_errors_are_waits_other_refusals_are_not():
    quota = 'pods "klique-3-1" is forbidden: exceeded quota: q, requested: pods=1'
    assert "quota is used up" in (kube_states.create_wait(403, quota) or "")
    assert kube_states.create_wait(429, "Too many requests") is not None
    assert kube_states.create_wait(503, "etcd leader changed") is not None
    assert kube_states.create_wait(403, 'violates PodSecurity "restricted:latest"') is None
    assert kube_states.create_wait(422, "Pod is invalid") is None


def test_retries_back_off_and_honour_retry_after():
    delays = [kube_states.retry_delay(n, None, 2, 60) for n in range(1, 8)]
    assert delays == [2, 4, 8, 16, 32, 60, 60]
    assert kube_states.retry_delay(1, 7, 2, 60) == 7
    assert kube_states.retry_delay(1, 3600, 2, 60) == 60  # bounded still
