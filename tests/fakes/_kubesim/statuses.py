"""The pieces of a pod's status the kubelet writes (the API reference's PodStatus and
ContainerStatus), and how it reads a container's termination message."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .store import now

NODE = "emulated-node"
MESSAGE_MAX = 4096
LOG_FALLBACK_LINES, LOG_FALLBACK_BYTES = 80, 2048


def is_sidecar(container: dict[str, Any]) -> bool:
    return container.get("restartPolicy") == "Always"


def waiting(container: dict[str, Any], reason: str, message: str = "") -> dict[str, Any]:
    state = {"reason": reason, **({"message": message} if message else {})}
    return status_of(container, {"waiting": state}, ready=False)


def status_of(container: dict[str, Any], state: dict[str, Any], ready: bool) -> dict[str, Any]:
    return {
        "name": container["name"], "image": container.get("image"), "imageID": "",
        "ready": ready, "restartCount": 0, "started": "running" in state, "state": state,
    }  # fmt: skip


def condition(kind: str, status: bool, reason: str = "", message: str = "") -> dict[str, Any]:
    found = {"type": kind, "status": "True" if status else "False", "lastTransitionTime": now()}
    found.update({k: v for k, v in (("reason", reason), ("message", message)) if v})
    return found


def creating(message: str) -> Callable[[dict[str, Any]], None]:
    """Every container waiting in ContainerCreating, with the kubelet's event as message."""

    def edit(pod: dict[str, Any]) -> None:
        containers = pod["spec"]["containers"]
        pod["status"]["containerStatuses"] = [
            waiting(c, "ContainerCreating", message) for c in containers
        ]

    return edit


UNKNOWN = {
    "exitCode": 137,
    "reason": "ContainerStatusUnknown",
    "message": "The container could not be located when the pod was terminated",
}


def set_condition(pod: dict[str, Any], new: dict[str, Any]) -> None:
    conditions = [c for c in pod["status"].get("conditions", []) if c["type"] != new["type"]]
    pod["status"]["conditions"] = [*conditions, new]


def termination_message(message_file: Path, log: Path, policy: str, code: int) -> str:
    data = b""
    with contextlib.suppress(OSError):
        data = message_file.read_bytes()[:MESSAGE_MAX]
    if not data and policy == "FallbackToLogsOnError" and code != 0:
        with contextlib.suppress(OSError):
            lines = log.read_bytes().splitlines(keepends=True)[-LOG_FALLBACK_LINES:]
            data = b"".join(lines)[-LOG_FALLBACK_BYTES:]
    return data.decode(errors="replace")
