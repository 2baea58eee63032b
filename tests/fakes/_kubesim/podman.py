"""The podman command lines the kubelet runs, built without I/O: a container of a pod as a
container runtime would create it from the pod's spec.

On this kind of machine podman needs runc and explicit ulimits (tests/conftest_services.py's
PODMAN_RUN_ARGS says why). The pod network is the host's (`--network host`): one node, and the
runner reaches the server on 127.0.0.1, where a cluster's pod network would route it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .store import parse_quantity

RUNTIME_ARGS = ("--runtime=/usr/sbin/runc", "--ulimit=nofile=1024:1024", "--ulimit=nproc=1000:1000")
LABEL = "klique.test/kubesim"  # every container carries it, valued with the emulator's state folder


@dataclass(frozen=True)
class Mount:
    source: str  # the host path
    target: str  # the path in the container
    read_only: bool


def security(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """The container's effective security context: the pod's, then the container's over it."""
    pod_level = pod["spec"].get("securityContext") or {}
    inherited = ("runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile")
    merged = {key: pod_level[key] for key in inherited if key in pod_level}
    merged.update(container.get("securityContext") or {})
    merged["supplementalGroups"] = list(pod_level.get("supplementalGroups") or [])
    if "fsGroup" in pod_level:
        merged["supplementalGroups"].append(pod_level["fsGroup"])
    return merged


def runs_as_root(context: dict[str, Any]) -> bool:
    """The image's user is root here (images imported from a root file system have no USER)."""
    return context.get("runAsUser") in (None, 0)


def security_args(context: dict[str, Any]) -> list[str]:
    args: list[str] = []
    if context.get("runAsUser") is not None:
        group = context.get("runAsGroup")
        args.append(f"--user={context['runAsUser']}" + (f":{group}" if group is not None else ""))
    args += [f"--group-add={gid}" for gid in context.get("supplementalGroups", [])]
    if context.get("privileged"):
        args.append("--privileged")
    capabilities = context.get("capabilities") or {}
    args += [f"--cap-drop={cap.lower()}" for cap in capabilities.get("drop") or []]
    args += [f"--cap-add={cap.lower()}" for cap in capabilities.get("add") or []]
    if context.get("allowPrivilegeEscalation") is False:
        args.append("--security-opt=no-new-privileges")
    if context.get("readOnlyRootFilesystem"):
        args += ["--read-only", "--read-only-tmpfs=false"]
    if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
        args.append("--security-opt=seccomp=unconfined")
    return args


def resource_args(container: dict[str, Any]) -> list[str]:
    """Limits as the runtime enforces them: memory (no swap beyond it) and CPU quota."""
    limits = (container.get("resources") or {}).get("limits") or {}
    args = []
    if "memory" in limits:
        size = int(parse_quantity(limits["memory"]))
        args += [f"--memory={size}b", f"--memory-swap={size}b"]
    if "cpu" in limits:
        args.append(f"--cpus={parse_quantity(limits['cpu']):g}")
    return args


def run_argv(
    podman: str,
    name: str,
    hostname: str,
    label: str,
    pod: dict[str, Any],
    container: dict[str, Any],
    mounts: list[Mount],
    env: dict[str, str],
) -> list[str]:
    """`podman run` of one container in the foreground: its output is the container's log and
    its exit status the container's."""
    argv = [podman, "run", *RUNTIME_ARGS, f"--name={name}", f"--label={LABEL}={label}"]
    argv += ["--rm", "--pull=never", "--network=host", f"--hostname={hostname}"]
    argv += security_args(security(pod, container))
    argv += resource_args(container)
    for mount in mounts:
        spec = f"type=bind,source={mount.source},destination={mount.target}"
        argv.append(f"--mount={spec}" + (",ro=true" if mount.read_only else ""))
    argv += [f"--env={key}={value}" for key, value in env.items()]
    if container.get("workingDir"):
        argv.append(f"--workdir={container['workingDir']}")
    if container.get("command"):
        argv.append(f"--entrypoint={json.dumps(container['command'])}")
    return [*argv, container["image"], *container.get("args", [])]


def stop_argv(podman: str, name: str, grace: float) -> list[str]:
    """SIGTERM, then SIGKILL after the grace period (the kubelet's KillContainer)."""
    return [podman, "stop", f"--time={max(int(grace), 0)}", name]


def kill_argv(podman: str, name: str) -> list[str]:
    return [podman, "kill", "--signal=KILL", name]


def remove_all_argv(podman: str, label: str) -> list[str]:
    """Every container the emulator with this state folder made, gone."""
    return [podman, "rm", "--force", "--time=0", f"--filter=label={LABEL}={label}"]
