"""The end of a task's pod in a Kubernetes pool: which pods are done with (their task's end
recorded), their log kept in the server's home, then the pod and its Secret deleted.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from broker.errors import KliqueError
from broker.pools import kube_pod, kube_states
from broker.pools.kube_api import KubeApi


def finished(
    pods: Mapping[str, dict[str, Any]], followed: set[str], ended: set[str]
) -> list[tuple[str, dict[str, Any]]]:
    """The pods to delete: a task's pod that is no longer followed (its end is recorded) and
    has ended, or that Klique ended while it waits (`ended`); a pod that still runs for a task
    Klique no longer follows is left alone, and one being deleted is not deleted twice."""
    done = []
    for name, pod in pods.items():
        if task_label(pod) is None or name in followed:
            continue
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        seen = kube_states.observe(pod)
        if (seen is not None and seen.state.final) or name in ended:
            done.append((name, pod))
    return done


async def save_log(api: KubeApi, folder: Path, name: str, pod: Mapping[str, Any]) -> None:
    """The task container's log (the runner's own output), kept as `<folder>/<name>.log`; by
    the container's name, so a template's sidecar takes nothing from it."""
    try:
        real = str((pod.get("metadata") or {}).get("name") or name)  # a Job's pod: its own
        text = await api.pod_log(real, kube_pod.RUNNER_CONTAINER)
    except KliqueError as exc:
        text = f"(no log: {exc})\n"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.log").write_text(text, encoding="utf-8")


async def delete(api: KubeApi, kind: str, name: str, grace_s: int) -> None:
    """Delete an attempt's pod (or its Job) and its Secret. The Secret goes with its pod
    (owned by it); deleted by name too, for the Secrets of pods made before Secrets had
    owners."""
    await api.delete(kind, name, grace_s=grace_s)
    await api.delete("Secret", f"{name}-task")


def task_label(pod: Mapping[str, Any]) -> int | None:
    """The task a pod runs, from its label; None for a pod that is no task's."""
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(kube_pod.LABEL_TASK)
    return int(value) if isinstance(value, str) and value.isdigit() else None
