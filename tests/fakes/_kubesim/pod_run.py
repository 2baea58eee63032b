"""One pod's life on the node, as the kubelet's (pkg/kubelet/kuberuntime, restartPolicy Never):
- bound when its requests fit the node (else Pending, PodScheduled=False, Unschedulable, with
  the scheduler's message), then ContainerCreating while its volumes cannot be set up (a missing
  ConfigMap or Secret: the FailedMount event's message, retried every second);
- each container's image must be in podman's local store: else ErrImagePull, then
  ImagePullBackOff for the back-off (10 s doubling to 300 s, times --image-backoff-scale),
  then another pull;
- init containers in order, each to its end (one that fails fails the pod); an init container
  with restartPolicy Always is a sidecar: started, then left running;
- then every container at once; when all have ended, the sidecars are stopped (SIGTERM, then
  SIGKILL after the grace period) and the phase is Succeeded if all exited 0, else Failed;
- the termination message: the first 4096 bytes of the file bind-mounted at
  terminationMessagePath (FallbackToLogsOnError: the log's last 80 lines, 2048 bytes, if the
  file is empty and the container failed);
- OOMKilled: exit 137 from a container with a memory limit that the kubelet did not kill
  (podman on cgroup v1 with runc does not report the kernel's OOM kill itself);
- activeDeadlineSeconds, from status.startTime: every container stopped, phase Failed, reason
  DeadlineExceeded;
- a deleted pod's containers are stopped within the grace period, the pod's final status is
  written (a terminal phase), then it leaves (DELETED).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import podman, volumes
from .statuses import (
    NODE,
    UNKNOWN,
    condition,
    creating,
    is_sidecar,
    set_condition,
    status_of,
    termination_message,
    waiting,
)
from .store import now

if TYPE_CHECKING:
    from .kubelet import Node  # the node runs its pods; a pod reports through its node

PULL_BACKOFF_START, PULL_BACKOFF_MAX = 10.0, 300.0  # pkg/kubelet/images: backOffPeriod
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class PodRun:
    """One pod on the node, from its volumes to its final status."""

    def __init__(self, node: Node, ns: str, name: str) -> None:
        self.node, self.ns, self.name = node, ns, name
        self.task: asyncio.Task[None] | None = None
        self.ended = asyncio.Event()
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self.stopping = ""  # why the kubelet stops the pod: Deleted, DeadlineExceeded, Lost
        self.killed: set[str] = set()  # containers the kubelet itself stopped
        self.grace = 30.0
        self.local: dict[str, Path] = {}
        self.uid = self.pod["metadata"]["uid"]

    @property
    def pod(self) -> dict[str, Any]:
        found = self.node.store.get(self.ns, "pods", self.name)
        assert found is not None
        return found

    async def set_status(
        self, container: dict[str, Any], status: dict[str, Any], init: bool
    ) -> None:
        field = "initContainerStatuses" if init else "containerStatuses"

        def edit(p: dict[str, Any]) -> None:
            statuses = p["status"].setdefault(field, [])
            p["status"][field] = [status if s["name"] == container["name"] else s for s in statuses]

        await self.node.report(self.ns, self.name, edit)

    async def run(self) -> None:
        found = self.node.store.get(self.ns, "pods", self.name)
        if found is None:
            return
        pod = copy.deepcopy(found)
        self.grace = float(pod["spec"].get("terminationGracePeriodSeconds", 30))
        if not await self.mount(pod):
            return
        deadline = pod["spec"].get("activeDeadlineSeconds")
        timer = None
        if deadline is not None:
            timer = asyncio.get_running_loop().create_task(self.deadline(float(deadline)))
        try:
            await self.containers(pod)
        finally:
            if timer is not None:
                timer.cancel()

    async def mount(self, pod: dict[str, Any]) -> bool:
        """Set up the volumes, retrying while one cannot be (False: the pod was stopped first)."""
        shown = ""
        while not self.stopping:
            try:
                self.local = volumes.set_up(self.node.store, self.ns, pod, self.node.folder(pod))
                return True
            except volumes.MountFailed as exc:
                if str(exc) != shown:
                    shown = str(exc)
                    await self.node.report(self.ns, self.name, creating(shown))
                    await self.event("FailedMount", shown, "Warning")
                await asyncio.sleep(1)
        return False

    def refresh(self) -> None:
        pod = self.node.store.get(self.ns, "pods", self.name)
        if self.local and pod is not None:
            volumes.refresh(self.node.store, self.ns, pod, self.node.folder(pod))

    async def containers(self, pod: dict[str, Any]) -> None:
        sidecars: list[asyncio.Task[int | None]] = []
        for init in pod["spec"].get("initContainers", []):
            if self.stopping:
                break
            if is_sidecar(init):
                started = asyncio.Event()
                sidecars.append(
                    asyncio.get_running_loop().create_task(self.container(pod, init, True, started))
                )
                await started.wait()
                continue
            code = await self.container(pod, init, True)
            if code != 0:
                await self.finish(pod, sidecars, failed=True)
                return
        await self.node.report(
            self.ns, self.name, lambda p: set_condition(p, condition("Initialized", True))
        )
        main = (
            [self.container(pod, c, False) for c in pod["spec"]["containers"]]
            if not self.stopping
            else []
        )
        codes = await asyncio.gather(*main)
        await self.finish(pod, sidecars, failed=any(code != 0 for code in codes) or not codes)

    async def finish(
        self, pod: dict[str, Any], sidecars: list[asyncio.Task[int | None]], failed: bool
    ) -> None:
        for init in pod["spec"].get("initContainers", []):
            if is_sidecar(init):
                await self.stop_container(init["name"], self.grace)
        await asyncio.gather(*sidecars, return_exceptions=True)
        why = self.stopping

        def end(p: dict[str, Any]) -> None:
            p["status"]["phase"] = "Failed" if failed or why == "DeadlineExceeded" else "Succeeded"
            if why == "DeadlineExceeded":
                p["status"]["reason"] = "DeadlineExceeded"
                p["status"]["message"] = (
                    "Pod was active on the node longer than the specified deadline"
                )
            for kind in ("Ready", "ContainersReady"):
                set_condition(p, condition(kind, False, "PodCompleted"))
            for field in ("initContainerStatuses", "containerStatuses"):
                for status in p["status"].get(field, []):
                    if "waiting" in status["state"] and why:
                        status["state"] = {"terminated": dict(UNKNOWN)}

        await self.node.report(self.ns, self.name, end)

    async def container(
        self,
        pod: dict[str, Any],
        container: dict[str, Any],
        init: bool,
        started: asyncio.Event | None = None,
    ) -> int | None:
        """One container from its image to its end: its exit code (None: it never started)."""
        try:
            if not await self.pull(container, init):
                return None
            argv = await self.command(pod, container, init)
            if argv is None:
                return None
            return await self.execute(pod, container, init, argv, started)
        finally:
            if started is not None:
                started.set()

    async def pull(self, container: dict[str, Any], init: bool) -> bool:
        image = container.get("image", "")
        backoff = PULL_BACKOFF_START
        while not self.stopping:
            exists = await asyncio.create_subprocess_exec(
                self.node.podman, "image", "exists", image
            )
            if await exists.wait() == 0:
                return True
            message = (
                f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": '
                f'failed to resolve reference "{image}": {image}: not found'
            )
            await self.set_status(container, waiting(container, "ErrImagePull", message), init)
            await self.event("Failed", f'Failed to pull image "{image}": {message}', "Warning")
            await self.pause(min(1.0, backoff * self.node.backoff_scale))
            back_off = f'Back-off pulling image "{image}"'
            await self.set_status(container, waiting(container, "ImagePullBackOff", back_off), init)
            await self.pause(backoff * self.node.backoff_scale)
            backoff = min(backoff * 2, PULL_BACKOFF_MAX)
        return False

    async def pause(self, seconds: float) -> None:
        ends = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < ends:
            await asyncio.sleep(min(0.2, max(ends - time.monotonic(), 0)))

    async def command(
        self, pod: dict[str, Any], container: dict[str, Any], init: bool
    ) -> list[str] | None:
        """The podman command line, or None after a CreateContainerConfigError."""
        context = podman.security(pod, container)
        uid = pod["metadata"]["uid"]
        if context.get("runAsNonRoot") and podman.runs_as_root(context):
            message = (
                "container has runAsNonRoot and image will run as root "
                f'(pod: "{self.name}_{self.ns}({uid})", container: {container["name"]})'
            )
            await self.set_status(
                container, waiting(container, "CreateContainerConfigError", message), init
            )
            return None
        try:
            env = self.environment(pod, container)
        except LookupError as exc:
            await self.set_status(
                container, waiting(container, "CreateContainerConfigError", str(exc)), init
            )
            return None
        where = self.node.folder(pod) / "containers" / container["name"]
        where.mkdir(parents=True, exist_ok=True)
        message_file = where / "termination-log"
        message_file.write_bytes(b"")
        message_file.chmod(0o666)  # any user the container runs as writes it
        mounts = [
            podman.Mount(
                str(volumes.mount_source(self.local, m)),
                m["mountPath"],
                bool(m.get("readOnly")) or self.read_only(pod, m["name"]),
            )
            for m in container.get("volumeMounts", [])
        ]
        target = container.get("terminationMessagePath") or "/dev/termination-log"
        mounts.append(podman.Mount(str(message_file), target, False))
        name = f"k8s_{container['name']}_{self.name}_{self.ns}_{uid}"
        return podman.run_argv(
            self.node.podman, name, self.name, self.node.label, pod, container, mounts, env
        )

    def read_only(self, pod: dict[str, Any], volume_name: str) -> bool:
        """ConfigMap, Secret and downward API volumes are mounted read-only by the kubelet."""
        for volume in pod["spec"].get("volumes", []):
            if volume["name"] == volume_name:
                return any(k in volume for k in ("configMap", "secret", "downwardAPI"))
        return False

    def environment(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        env = {"PATH": SYSTEM_PATH, "HOSTNAME": self.name}
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = str(item["value"])
                continue
            source = item.get("valueFrom") or {}
            if "fieldRef" in source:
                env[item["name"]] = volumes.field_value(pod, source["fieldRef"]["fieldPath"])
            for ref, plural, kind in (
                ("secretKeyRef", "secrets", "secret"),
                ("configMapKeyRef", "configmaps", "configmap"),
            ):
                if ref in source:
                    env[item["name"]] = self.key_ref(source[ref], plural, kind)
        return env

    def key_ref(self, ref: dict[str, Any], plural: str, kind: str) -> str:
        obj = self.node.store.get(self.ns, plural, ref["name"])
        if obj is None:
            raise LookupError(f'{kind} "{ref["name"]}" not found')
        data = obj.get("data") or {}
        if ref["key"] not in data:
            raise LookupError(
                f"couldn't find key {ref['key']} in {kind.capitalize()} {self.ns}/{ref['name']}"
            )
        value = data[ref["key"]]
        return base64.b64decode(value).decode() if plural == "secrets" else str(value)

    async def execute(
        self,
        pod: dict[str, Any],
        container: dict[str, Any],
        init: bool,
        argv: list[str],
        started: asyncio.Event | None,
    ) -> int:
        name = container["name"]
        log = self.node.log_path(pod, name)
        with log.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
            )
        self.processes[name] = process
        if self.stopping:  # stopped while this container was being created
            asyncio.get_running_loop().create_task(self.stop_container(name, self.grace))
        began = now()
        running = status_of(container, {"running": {"startedAt": began}}, ready=True)
        await self.set_status(container, running, init)
        if not init or is_sidecar(container):
            await self.node.report(self.ns, self.name, self.mark_running)
        if started is not None:
            started.set()
        code = await process.wait()
        limited = "memory" in ((container.get("resources") or {}).get("limits") or {})
        oom = code == 137 and limited and name not in self.killed
        reason = "OOMKilled" if oom else ("Completed" if code == 0 else "Error")
        policy = container.get("terminationMessagePolicy", "File")
        message = termination_message(log.parent / "termination-log", log, policy, code)
        terminated = {
            "exitCode": code,
            "reason": reason,
            "startedAt": began,
            "finishedAt": now(),
            "containerID": "",
        }
        if message:
            terminated["message"] = message
        await self.set_status(
            container, status_of(container, {"terminated": terminated}, ready=False), init
        )
        return code

    def mark_running(self, p: dict[str, Any]) -> None:
        if p["status"].get("phase") == "Pending":
            p["status"]["phase"] = "Running"
        for kind in ("Ready", "ContainersReady"):
            set_condition(p, condition(kind, True))

    async def stop_container(self, name: str, grace: float) -> None:
        process = self.processes.get(name)
        if process is None or process.returncode is not None:
            return
        self.killed.add(name)
        argv = podman.stop_argv(self.node.podman, self.container_name(name), grace)
        for _ in range(50):  # the container may not exist yet just after `podman run` started
            stopper = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
            )
            if await stopper.wait() == 0 or process.returncode is not None:
                return
            await asyncio.sleep(0.2)

    def container_name(self, name: str) -> str:
        return f"k8s_{name}_{self.name}_{self.ns}_{self.uid}"

    async def stop(self, why: str, grace: float) -> None:
        """Stop every container (the kubelet's killPod), recording why."""
        if not self.stopping:
            self.stopping = why
        names = list(self.processes)
        await asyncio.gather(*(self.stop_container(name, grace) for name in names))

    async def deadline(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self.stop("DeadlineExceeded", self.grace)

    async def power_off(self) -> None:
        self.stopping = self.stopping or "Lost"
        for name in list(self.processes):
            self.killed.add(name)
            killer = await asyncio.create_subprocess_exec(
                *podman.kill_argv(self.node.podman, self.container_name(name)),
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            await killer.wait()

    async def event(self, reason: str, message: str, kind: str = "Normal") -> None:
        """An Event about the pod, as the kubelet records one (kubectl describe shows them)."""
        pod = self.node.store.get(self.ns, "pods", self.name)
        if pod is None:
            return
        name = f"{self.name}.{time.monotonic_ns():x}"
        involved = {"kind": "Pod", "namespace": self.ns, "name": self.name, "uid": self.uid}
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": name,
                "namespace": self.ns,
                "uid": name,
                "creationTimestamp": now(),
            },
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": "kubelet", "host": NODE},
            "firstTimestamp": now(),
            "lastTimestamp": now(),
            "count": 1,
        }
        await self.node.store.write(self.ns, "events", "ADDED", event)
