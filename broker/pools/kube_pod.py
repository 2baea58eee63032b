"""Pods for a Kubernetes pool, rendered without I/O: a base pod template, the compute resource's
overrides over it, then the fields Klique owns over both (docs/kubernetes.md).

Both templates are YAML files the platform team edits, found like batch templates (the site's
`templates_dir` first, then the shipped templates/): the base is `kubernetes/<pod_template>.yaml`
(`pod.yaml` ships), the overrides `kubernetes/<resource>.yaml` (optional). Nothing a task's
owner controls enters them: the task's command, env and code travel in task.json (a Secret);
the pod carries only validated names, numbers and the checked image reference.

The merge (`merge`), one rule per shape:
- mappings merge key by key; a `null` in the overrides removes the key;
- lists of named items (containers, initContainers, env, volumes, volumeMounts, ports,
  envFrom is not named and is replaced) merge item by item on `name`: an item of the same name
  is merged, a new name is appended;
- `tolerations` are appended (an identical one is not added twice);
- any other list, and any scalar, is replaced.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from broker.errors import TemplateError

RUNNER_CONTAINER = "task"  # the container Klique runs the runner in
RUNNER_MOUNT = "/opt/klique"  # the runner ConfigMap, read-only
RUNNER_FILE = "klique-runner.pyz"
TASK_FILE = "task.json"
# Kubernetes' default terminationMessagePath: a file the kubelet bind-mounts, outside the job
# folder, which the runner writes in place (inside_job/termination.py names it by this env).
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_ENV = "KLIQUE_TERMINATION_LOG"
LABEL_PREFIX = "klique.dev"
LABEL_TASK = f"{LABEL_PREFIX}/task"
LABEL_ATTEMPT = f"{LABEL_PREFIX}/attempt"
LABEL_POOL = f"{LABEL_PREFIX}/pool"
LABEL_INSTALLATION = f"{LABEL_PREFIX}/installation"

# Lists whose items merge on `name` (the Kubernetes API's own merge keys for these fields).
_BY_NAME = frozenset(
    {"containers", "initContainers", "env", "volumes", "volumeMounts", "ports", "volumeDevices"}
)
_APPENDED = frozenset({"tolerations"})

# RFC 1123 label (pod names as Klique makes them) and label values (kubernetes.io
# /docs/concepts/overview/working-with-objects/names/ and .../labels/#syntax-and-character-set).
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
RESOURCE_NAME = re.compile(
    r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
_PYTHON = re.compile(r"[A-Za-z0-9_./+-]{1,255}")


def merge(base: Any, override: Any, key: str = "") -> Any:
    """`override` over `base` by the rules in this module's docstring; neither is changed."""
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        merged = {k: copy.deepcopy(v) for k, v in base.items()}
        for k, v in override.items():
            if v is None:
                merged.pop(k, None)
            elif k in merged:
                merged[k] = merge(merged[k], v, k)
            else:
                merged[k] = copy.deepcopy(v)
        return merged
    if isinstance(base, list) and isinstance(override, list):
        if key in _BY_NAME and _named(base) and _named(override):
            return _merge_by_name(base, override)
        if key in _APPENDED:
            return copy.deepcopy(base) + [copy.deepcopy(v) for v in override if v not in base]
    return copy.deepcopy(override)


def _named(items: list[Any]) -> bool:
    return all(isinstance(i, Mapping) and isinstance(i.get("name"), str) for i in items)


def _merge_by_name(base: list[Any], override: list[Any]) -> list[Any]:
    merged = [copy.deepcopy(i) for i in base]
    index = {item["name"]: n for n, item in enumerate(merged)}
    for item in override:
        if item["name"] in index:
            n = index[item["name"]]
            merged[n] = merge(merged[n], item)
        else:
            index[item["name"]] = len(merged)
            merged.append(copy.deepcopy(item))
    return merged


# The templates.


def load_yaml(path: Path) -> dict[str, Any]:
    """One template file: a YAML mapping, or a TemplateError naming the file."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise TemplateError(f"{path}: {exc}") from exc
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise TemplateError(f"{path}: a pod template is a YAML mapping (a Pod manifest)")
    return doc


def find_base(name: str, roots: tuple[Path, ...]) -> Path:
    for root in roots:
        path = root / "kubernetes" / f"{name}.yaml"
        if path.is_file():
            return path
    where = " or ".join(str(root / "kubernetes" / f"{name}.yaml") for root in roots)
    raise TemplateError(f"no base pod template {name!r}: add {where}")


def find_overrides(resource: str, roots: tuple[Path, ...]) -> Path | None:
    """The compute resource's overrides, `kubernetes/<resource>.yaml`, if any."""
    for root in roots:
        path = root / "kubernetes" / f"{resource}.yaml"
        if path.is_file():
            return path
    return None


# What Klique sets.


@dataclass(frozen=True)
class GpuForms:
    """The pool's resource names for each kind of GPU request (docs/kubernetes.md)."""

    whole: str = "nvidia.com/gpu"
    mig: str | None = None  # a fraction or a GPU-memory request takes one slice of this
    shared: str | None = None  # else one time-sliced replica, its memory capped by the runner
    gpu_memory_mb: int = 0  # memory of one GPU: a fraction's cap on a shared GPU


@dataclass(frozen=True)
class PodRequest:
    """Everything a pod is rendered from: validated values only."""

    name: str  # klique-<task>-<attempt>
    task_id: int
    attempt: int
    pool: str
    installation: str
    image: str
    python: str
    job_dir: str  # the runner's folder in the pod (an emptyDir)
    secret: str  # holds task.json
    runner_config_map: str
    cpus: int
    memory_mb: int
    walltime_s: int
    gpus: int = 0
    gpu_fraction: float | None = None
    gpu_memory_mb: int | None = None
    run_as_user: int = 1000


def gpu_limits(request: PodRequest, forms: GpuForms) -> tuple[dict[str, int], int | None]:
    """The pod's GPU limits, and the per-process GPU memory cap (MiB) the runner enforces."""
    if request.gpus:
        return {forms.whole: request.gpus}, None
    if request.gpu_fraction is None and request.gpu_memory_mb is None:
        return {}, None  # a CPU-only compute resource gets no GPU at all
    if forms.mig:
        return {forms.mig: 1}, None
    if forms.shared:
        cap = memory_share_mb(request.gpu_fraction, request.gpu_memory_mb, forms.gpu_memory_mb)
        return {forms.shared: 1}, cap
    return {forms.whole: 1}, None  # no sharing configured: a fraction takes a whole GPU


def memory_share_mb(
    gpu_fraction: float | None, gpu_memory_mb: int | None, one_gpu_mb: int
) -> int | None:
    """A share of a GPU as the cap on its memory (MiB) the runner enforces: the amount asked
    for, else the fraction of one GPU's memory (None: no share, or the GPU's size unknown)."""
    if gpu_memory_mb is not None:
        return gpu_memory_mb
    if gpu_fraction is not None and one_gpu_mb:
        return int(gpu_fraction * one_gpu_mb)
    return None


# Pod Security "restricted" (kubernetes.io/docs/concepts/security/pod-security-standards/
# #restricted): what every container of every pod carries, init containers and a template's
# sidecars included; a template may add to it only where the pool allows privileged templates.
RESTRICTED_CONTAINER: Mapping[str, Any] = {
    "allowPrivilegeEscalation": False,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


def klique_fields(request: PodRequest, forms: GpuForms) -> dict[str, Any]:
    """The part of the pod Klique owns: merged last, so no template can change it."""
    check_request(request, forms)
    limits: dict[str, Any] = {"cpu": str(request.cpus), "memory": f"{request.memory_mb}Mi"}
    gpus, _ = gpu_limits(request, forms)
    limits.update({name: str(count) for name, count in gpus.items()})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": request.name, "labels": labels(request)},
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": request.walltime_s,
            "automountServiceAccountToken": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": request.run_as_user,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": RUNNER_CONTAINER,
                    "image": request.image,
                    "command": [
                        request.python,
                        f"{RUNNER_MOUNT}/{RUNNER_FILE}",
                        request.job_dir,
                    ],
                    "workingDir": request.job_dir,
                    "env": [
                        {"name": "HOME", "value": request.job_dir},
                        {"name": "PYTHONUNBUFFERED", "value": "1"},
                        {"name": TERMINATION_ENV, "value": TERMINATION_LOG},
                    ],
                    "resources": {"requests": dict(limits), "limits": limits},
                    # The kubelet keeps the runner's exit record, written in place to this file
                    # (never renamed: it is a bind mount), as the container's termination
                    # message (up to 4096 bytes): the pod's own record of how the task ended.
                    "terminationMessagePath": TERMINATION_LOG,
                    "terminationMessagePolicy": "File",
                    "securityContext": {
                        **RESTRICTED_CONTAINER,
                        "privileged": False,
                        "runAsUser": request.run_as_user,
                    },
                    "volumeMounts": [
                        {"name": "klique-job", "mountPath": request.job_dir},
                        {"name": "klique-runner", "mountPath": RUNNER_MOUNT, "readOnly": True},
                        {
                            "name": "klique-task",
                            "mountPath": f"{request.job_dir}/{TASK_FILE}",
                            "subPath": TASK_FILE,
                            "readOnly": True,
                        },
                    ],
                }
            ],
            "volumes": [
                {"name": "klique-job", "emptyDir": {}},
                {
                    "name": "klique-runner",
                    "configMap": {"name": request.runner_config_map, "defaultMode": 0o444},
                },
                {"name": "klique-task", "secret": {"secretName": request.secret}},
            ],
        },
    }


def labels(request: PodRequest) -> dict[str, str]:
    return {
        LABEL_TASK: str(request.task_id),
        LABEL_ATTEMPT: str(request.attempt),
        LABEL_POOL: request.pool,
        LABEL_INSTALLATION: request.installation,
    }


def check_request(request: PodRequest, forms: GpuForms) -> None:
    """Every value that enters the pod: a name, label or resource name it may be."""
    if not DNS_LABEL.fullmatch(request.name) or not DNS_LABEL.fullmatch(request.secret):
        raise TemplateError(f"pod name {request.name!r} is not an RFC 1123 label")
    for value in labels(request).values():
        if not LABEL_VALUE.fullmatch(value) or len(value) > 63:
            raise TemplateError(
                f"label value {value!r} is not a Kubernetes label value; fix: pool names and "
                "installation ids of 63 letters, digits, '-', '_' or '.' at most"
            )
    for name in filter(None, (forms.whole, forms.mig, forms.shared)):
        if not RESOURCE_NAME.fullmatch(name):
            raise TemplateError(f"GPU resource name {name!r} is not a Kubernetes resource name")
    if not _PYTHON.fullmatch(request.python):
        raise TemplateError(
            f"python {request.python!r} is not a plain path; fix: name the image's interpreter"
        )


def render_pod(
    request: PodRequest,
    forms: GpuForms,
    base: Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
    allow_privileged: bool = False,
) -> dict[str, Any]:
    """Base template, then the compute resource's overrides, then Klique's fields, then the
    restricted security context on every container the templates did not set otherwise. A
    template that adds privileges is refused (TemplateError) unless `allow_privileged`."""
    pod = merge(base, overrides or {})
    if not allow_privileged:
        found = privileges(pod)
        if found:
            raise TemplateError(
                f"the pod template adds privileges: {'; '.join(found)}; fix: remove them, or set "
                "allow_privileged_templates: true on the pool"
            )
    pod = harden(merge(pod, klique_fields(request, forms)))
    _, cap = gpu_limits(request, forms)
    if cap is not None:
        container = next(c for c in pod["spec"]["containers"] if c["name"] == RUNNER_CONTAINER)
        # Also told to the runner (task.json), which sets it after the task's own env.
        cap_env = {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": f"0={cap}M"}
        container["env"] = merge(container["env"], [cap_env], "env")
    return pod


def memory_cap_mb(request: PodRequest, forms: GpuForms) -> int | None:
    return gpu_limits(request, forms)[1]


def harden(pod: dict[str, Any]) -> dict[str, Any]:
    """Every container gets the restricted security context under what its template set (a
    sidecar or init container of a site's template included), and the pod RuntimeDefault
    seccomp: a template's own settings win, and `privileges` judged those already."""
    spec = pod.setdefault("spec", {})
    spec["securityContext"] = merge(
        {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        spec.get("securityContext") or {},
    )
    for field in _CONTAINER_LISTS:
        for container in spec.get(field) or []:
            container["securityContext"] = merge(
                RESTRICTED_CONTAINER, container.get("securityContext") or {}
            )
    return pod


# Fields of a pod template that give a pod more than Pod Security "restricted" allows, or a
# credential of the cluster: (field, test of its value, what it does).
_POD_PRIVILEGES: tuple[tuple[str, Any, str], ...] = (
    ("hostNetwork", lambda v: v is True, "shares the node's network"),
    ("hostPID", lambda v: v is True, "sees the node's processes"),
    ("hostIPC", lambda v: v is True, "shares the node's IPC"),
    ("automountServiceAccountToken", lambda v: v is True, "mounts a service account token"),
    ("serviceAccountName", lambda v: bool(v), "runs as a service account"),
    ("serviceAccount", lambda v: bool(v), "runs as a service account"),
    ("securityContext.runAsNonRoot", lambda v: v is False, "may run as root"),
    ("securityContext.runAsUser", lambda v: v == 0, "runs as root"),
    ("securityContext.seccompProfile.type", lambda v: v == "Unconfined", "turns seccomp off"),
)
_CONTAINER_PRIVILEGES: tuple[tuple[str, Any, str], ...] = (
    ("securityContext.privileged", lambda v: v is True, "is privileged"),
    ("securityContext.allowPrivilegeEscalation", lambda v: v is True, "may gain privileges"),
    (
        "securityContext.capabilities.add",
        lambda v: bool(set(v or ()) - {"NET_BIND_SERVICE"}),
        "adds capabilities",
    ),
    ("securityContext.runAsNonRoot", lambda v: v is False, "may run as root"),
    ("securityContext.runAsUser", lambda v: v == 0, "runs as root"),
    ("securityContext.seccompProfile.type", lambda v: v == "Unconfined", "turns seccomp off"),
    ("securityContext.procMount", lambda v: v == "Unmasked", "unmasks /proc"),
)


def privileges(template: Mapping[str, Any]) -> list[str]:
    """What a pod template adds beyond Pod Security "restricted" and Klique's own fields, each
    as `field path (what it does)`: host namespaces, hostPath volumes, host ports, privileged
    or escalating containers, added capabilities, root, unconfined seccomp, a service account
    token. Empty for a template that adds none."""
    spec = template.get("spec") or {}
    found = [
        f"spec.{path} = {value!r} ({words})"
        for path, bad, words in _POD_PRIVILEGES
        if (value := _at(spec, path)) is not None and bad(value)
    ]
    for n, volume in enumerate(spec.get("volumes") or []):
        where = f"spec.volumes[{n}]"
        if isinstance(volume, Mapping) and volume.get("hostPath") is not None:
            found.append(f"{where}.hostPath (mounts the node's files)")
        sources = ((volume or {}).get("projected") or {}).get("sources") or []
        if any(isinstance(s, Mapping) and "serviceAccountToken" in s for s in sources):
            found.append(f"{where}.projected.sources.serviceAccountToken (a token of the cluster)")
    for field in _CONTAINER_LISTS:
        for n, container in enumerate(spec.get(field) or []):
            if not isinstance(container, Mapping):
                continue
            where = f"spec.{field}[{n}]"
            found += [
                f"{where}.{path} = {value!r} ({words})"
                for path, bad, words in _CONTAINER_PRIVILEGES
                if (value := _at(container, path)) is not None and bad(value)
            ]
            found += [
                f"{where}.ports[{i}].hostPort (listens on the node)"
                for i, port in enumerate(container.get("ports") or [])
                if isinstance(port, Mapping) and port.get("hostPort")
            ]
    return found


def _at(obj: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj
