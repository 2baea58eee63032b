"""The container's termination message: how the task ended, where a kubelet reads it.

A kubelet bind-mounts a file of its own at the container's `terminationMessagePath` and copies
its first 4096 bytes into the pod's status when the container ends
(https://kubernetes.io/docs/tasks/debug/debug-application/determine-reason-pod-failure/).
A bind-mounted file cannot be renamed over or unlinked (EBUSY), so it is written in place:
opened, truncated, written, synced. The pod names the path in KLIQUE_TERMINATION_LOG; exit.json
in the job folder stays the runner's own record, written by rename as on every pool.
"""

from __future__ import annotations

import json
import os

ENV = "KLIQUE_TERMINATION_LOG"
LIMIT = 4096  # what the kubelet keeps of the file (bytes)
_DROPPED_FIRST = ("environment", "started", "finished")  # what the server reads least


def message(result: dict) -> bytes:
    """The exit record as one JSON document of at most LIMIT bytes: whole when it fits, else
    without its least needed fields, then with its reason shortened (never cut mid-document)."""
    doc = dict(result)
    data = _encoded(doc)
    for field in _DROPPED_FIRST:
        if len(data) <= LIMIT:
            return data
        doc.pop(field, None)
        data = _encoded(doc)
    reason = str(doc.get("reason") or "")
    while len(data) > LIMIT and reason:
        reason = reason[: len(reason) // 2]
        doc["reason"] = reason
        data = _encoded(doc)
    return data


def _encoded(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")


def write(result: dict, path: str | None = None) -> None:
    """Write the termination message in place, where the pod asks for one (else nothing)."""
    path = path if path is not None else os.environ.get(ENV)
    if not path:
        return
    data = message(result)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
