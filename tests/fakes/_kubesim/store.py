"""The API server's storage: objects by (namespace, plural, name), one revision counter as
etcd's, a bounded event history for watches, and the kinds it serves."""

from __future__ import annotations

import asyncio
import copy
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

CLUSTER = ""  # the namespace key of cluster-scoped objects (namespaces)


@dataclass(frozen=True)
class Kind:
    """A resource the API serves: its kind, apiVersion and URL prefix (api/v1 or apis/G/V)."""

    kind: str
    api_version: str = "v1"

    @property
    def prefix(self) -> str:
        return "api/v1" if self.api_version == "v1" else f"apis/{self.api_version}"


# By plural. Other modules register theirs (Kueue's Jobs and Workloads) before the app is made.
KINDS: dict[str, Kind] = {
    "pods": Kind("Pod"),
    "secrets": Kind("Secret"),
    "configmaps": Kind("ConfigMap"),
    "resourcequotas": Kind("ResourceQuota"),
    "events": Kind("Event"),
    "namespaces": Kind("Namespace"),
}


def now(later: float = 0) -> str:
    """The API's time format (RFC 3339, UTC, seconds), `later` seconds from now."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + later))


def status_body(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    """A Status object, as every error of the API server is one."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def status_error(code: int, reason: str, message: str, **details: Any) -> JSONResponse:
    return JSONResponse(status_body(code, reason, message, **details), status_code=code)


_SUFFIXES = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
    "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "m": 1e-3,
}  # fmt: skip


def parse_quantity(value: object) -> float:
    """A Kubernetes quantity: 500m, 2, 400Mi, 1G (the API reference's Quantity)."""
    text = str(value)
    for suffix, factor in _SUFFIXES.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Equality-based label selectors: a=b, a==b, a!=b, a (exists), !a (does not)."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = re.split(r"==?", term, maxsplit=1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what the API server applies for merge-patch+json; a strategic
    merge patch of the fields Klique sends reads the same)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


class Store:
    """Objects by (namespace, plural, name), one revision counter, a bounded event history."""

    def __init__(self, history: int) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.revision = 1
        self.history: list[tuple[int, str, str, str, dict[str, Any]]] = []
        self.oldest = 1  # watches may resume from this revision or later
        self.keep = history
        self.changed = asyncio.Condition()
        self.generation = 0  # bumped by compact: open watches end
        self.requests: dict[str, dict[str, int]] = {"list": {}, "watch": {}}  # by selector

    def count(self, verb: str, selector: str) -> None:
        self.requests[verb][selector] = self.requests[verb].get(selector, 0) + 1

    def get(self, ns: str, plural: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((ns, plural, name))

    def items(self, ns: str, plural: str) -> list[dict[str, Any]]:
        return [obj for (n, p, _), obj in sorted(self.objects.items()) if n == ns and p == plural]

    def stamp(self, ns: str, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """What the API server sets on a new object."""
        kind = KINDS[plural]
        obj.setdefault("apiVersion", kind.api_version)
        obj.setdefault("kind", kind.kind)
        meta = obj.setdefault("metadata", {})
        if ns != CLUSTER:
            meta["namespace"] = ns
        meta.update({"uid": str(uuid.uuid4()), "creationTimestamp": now()})
        return obj

    async def write(self, ns: str, plural: str, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        key = (ns, plural, obj["metadata"]["name"])
        if kind == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = obj
        self.history.append((self.revision, ns, plural, kind, copy.deepcopy(obj)))
        if len(self.history) > self.keep:
            dropped = self.history[: len(self.history) - self.keep]
            self.history = self.history[len(dropped) :]
            self.oldest = dropped[-1][0] + 1
        async with self.changed:
            self.changed.notify_all()
        return obj

    async def change(self, ns: str, plural: str, name: str, edit: Any) -> dict[str, Any] | None:
        """Apply `edit` to a copy of the object and write it (None: the object is gone)."""
        obj = self.get(ns, plural, name)
        if obj is None:
            return None
        obj = copy.deepcopy(obj)
        edit(obj)
        return await self.write(ns, plural, "MODIFIED", obj)

    async def compact(self) -> None:
        self.revision += 1  # as writes elsewhere in the cluster advance it
        self.history.clear()
        self.oldest = self.revision + 1
        self.generation += 1
        async with self.changed:
            self.changed.notify_all()
