"""Admission, in the API server's order for a create: the object's schema (422 Invalid), its
namespace (404), Pod Security Admission at the namespace's level (403), ResourceQuota (403).

Messages are the API server's own (k8s.io/pod-security-admission/admission/admission.go,
plugin/pkg/admission/resourcequota/controller.go), so a client parses what a cluster says.
Each check returns None when the object is admitted, else (code, reason, message)."""

from __future__ import annotations

import importlib
import math
import re
from typing import Any

import kubernetes_validate

from .store import CLUSTER, KINDS, Store, parse_quantity

SCHEMA_VERSION = "1.33"
ENFORCE = "pod-security.kubernetes.io/enforce"
ENFORCE_VERSION = "pod-security.kubernetes.io/enforce-version"
NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
TERMINAL = ("Succeeded", "Failed")

Refusal = tuple[int, str, str]


def admit(store: Store, ns: str, plural: str, obj: dict[str, Any], strict: bool) -> Refusal | None:
    """The first refusal of a create, or None."""
    for check in (schema, namespace_exists, pod_security, quota):
        refusal = check(store, ns, plural, obj, strict)
        if refusal is not None:
            return refusal
    return None


def schema(store: Store, ns: str, plural: str, obj: dict[str, Any], strict: bool) -> Refusal | None:
    """Names as the API validates them; pods against the OpenAPI schema (kubernetes-validate).
    Unknown fields fail only with fieldValidation=Strict, as the API server's default drops them."""
    kind = KINDS[plural].kind
    name = (obj.get("metadata") or {}).get("name", "")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        return 422, "Invalid", f'{kind} "{name}" is invalid: metadata.name: Invalid value: "{name}"'
    if plural != "pods":
        return None
    try:
        kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=strict)
    except kubernetes_validate.ValidationError as exc:
        return 422, "Invalid", f'Pod "{name}" is invalid: {field_path(exc.path)}: {exc.message}'
    return None


def field_path(path: Any) -> str:
    """spec.containers[0].image, as the API names a field."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text.lstrip(".") or "<root>"


def namespace_exists(
    store: Store, ns: str, plural: str, obj: dict[str, Any], strict: bool
) -> Refusal | None:
    if ns == CLUSTER or store.get(CLUSTER, "namespaces", ns) is not None:
        return None
    return 404, "NotFound", f'namespaces "{ns}" not found'


def pod_security(
    store: Store, ns: str, plural: str, obj: dict[str, Any], strict: bool
) -> Refusal | None:
    """The namespace's enforce level, checked by pod_security.violations (the Pod Security
    Standards as a pure checker of its own)."""
    if plural != "pods":
        return None
    labels = ((store.get(CLUSTER, "namespaces", ns) or {}).get("metadata") or {}).get(
        "labels"
    ) or {}
    level = labels.get(ENFORCE, "privileged")
    if level == "privileged":
        return None
    version = labels.get(ENFORCE_VERSION, "latest")
    found = standards().violations(obj, level)
    if not found:
        return None
    name = obj["metadata"]["name"]
    listed = ", ".join(found)
    return (
        403,
        "Forbidden",
        f'pods "{name}" is forbidden: violates PodSecurity "{level}:{version}": {listed}',
    )


def standards() -> Any:
    """tests/fakes/_kubesim/pod_security.py: `violations(pod, level) -> list[str]`."""
    return importlib.import_module(f"{__package__}.pod_security")


# ResourceQuota (kubernetes.io/docs/concepts/policy/resource-quotas/).


def pod_usage(pod: dict[str, Any]) -> dict[str, float]:
    """What a pod counts against a quota: pods=1, then requests.* and limits.* of its
    containers (a request defaults to its limit; an init container counts if it is larger)."""
    spec = pod.get("spec") or {}
    usage: dict[str, float] = {"pods": 1.0}
    for which in ("requests", "limits"):
        total = _sum(spec.get("containers") or [], which)
        for init in spec.get("initContainers") or []:
            for key, value in _sum([init], which).items():
                total[key] = max(total.get(key, 0.0), value)
        for key, value in total.items():
            usage[f"{which}.{key}"] = value
            if which == "requests" and key in ("cpu", "memory"):
                usage[key] = value  # `cpu` in a quota means requests.cpu
    return usage


def _sum(containers: list[dict[str, Any]], which: str) -> dict[str, float]:
    total: dict[str, float] = {}
    for container in containers:
        resources = container.get("resources") or {}
        wanted = dict(resources.get("limits") or {})
        if which == "requests":
            wanted.update(resources.get("requests") or {})
        for key, value in wanted.items():
            total[key] = total.get(key, 0.0) + parse_quantity(value)
    return total


def quota_used(store: Store, ns: str, hard: dict[str, Any]) -> dict[str, float]:
    """The namespace's live pods (not yet Succeeded or Failed) against `hard`'s keys."""
    used = {key: 0.0 for key in hard}
    for pod in store.items(ns, "pods"):
        if (pod.get("status") or {}).get("phase") in TERMINAL:
            continue
        for key, value in pod_usage(pod).items():
            if key in used:
                used[key] += value
    return used


def quota(store: Store, ns: str, plural: str, obj: dict[str, Any], strict: bool) -> Refusal | None:
    if plural != "pods":
        return None
    wanted = pod_usage(obj)
    for rq in store.items(ns, "resourcequotas"):
        hard = (rq.get("spec") or {}).get("hard") or {}
        used = quota_used(store, ns, hard)
        over = sorted(
            key
            for key, limit in hard.items()
            if wanted.get(key, 0.0) and used[key] + wanted[key] > parse_quantity(limit) + 1e-9
        )
        if over:
            name, quota_name = obj["metadata"]["name"], rq["metadata"]["name"]

            limits = {key: parse_quantity(hard[key]) for key in over}
            message = (
                f'pods "{name}" is forbidden: exceeded quota: {quota_name}, requested: '
                f"{listed(over, wanted)}, used: {listed(over, used)}, "
                f"limited: {listed(over, limits)}"
            )
            return 403, "Forbidden", message
    return None


def listed(keys: list[str], values: dict[str, float]) -> str:
    """pods=1,requests.cpu=500m: the resources a quota message names."""
    return ",".join(f"{key}={quantity(key, values[key])}" for key in keys)


def quantity(key: str, value: float) -> str:
    """A quantity as the API prints it: 1, 500m, 400Mi, 2Gi."""
    if key.endswith("cpu") and not float(value).is_integer():
        return f"{math.ceil(value * 1000)}m"
    if key.endswith("memory") or key.endswith("storage"):
        for suffix, factor in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if value >= factor and float(value / factor).is_integer():
                return f"{int(value / factor)}{suffix}"
    return str(int(value)) if float(value).is_integer() else str(value)


def quota_status(store: Store, rq: dict[str, Any]) -> dict[str, Any]:
    """status.hard and status.used, as the quota controller keeps them."""
    hard = (rq.get("spec") or {}).get("hard") or {}
    used = quota_used(store, rq["metadata"].get("namespace", ""), hard)
    return {"hard": dict(hard), "used": {key: quantity(key, value) for key, value in used.items()}}
