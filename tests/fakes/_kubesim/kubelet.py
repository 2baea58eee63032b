"""The node `emulated-node`: the scheduler's fit check, the pods bound to it (each a PodRun,
pod_run.py), and its readiness (a lost node, the taint manager's eviction)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import podman
from .pod_run import PodRun
from .statuses import NODE, condition, set_condition, waiting
from .store import Store, now, parse_quantity

__all__ = ["NODE", "Node", "condition", "set_condition"]
TERMINAL = ("Succeeded", "Failed")


def pod_requests(pod: dict[str, Any]) -> dict[str, float]:
    total: dict[str, float] = {}
    for c in pod["spec"].get("containers", []):
        res = c.get("resources") or {}
        wanted = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for key, value in wanted.items():
            total[key] = total.get(key, 0.0) + parse_quantity(value)
    return total


class Node:
    """Scheduling onto the one node, its pods' runs, and its readiness."""

    def __init__(
        self,
        store: Store,
        state: Path,
        allocatable: dict[str, float],
        binary: str = "podman",
        backoff_scale: float = 1.0,
    ) -> None:
        self.store = store
        self.state = state
        self.allocatable = allocatable
        self.podman = binary
        self.backoff_scale = backoff_scale
        self.label = str(state)
        self.bound: dict[tuple[str, str], dict[str, float]] = {}
        self.runs: dict[tuple[str, str], PodRun] = {}
        self.ready = asyncio.Event()
        self.ready.set()
        self.deferred: list[tuple[str, str, Callable[[dict[str, Any]], None]]] = []
        self.on_gone: Callable[[str, str], Any] | None = None  # the API's removal of a pod

    def folder(self, pod: dict[str, Any]) -> Path:
        return self.state / "pods" / pod["metadata"]["uid"]

    async def report(self, ns: str, name: str, edit: Callable[[dict[str, Any]], None]) -> None:
        """A kubelet status write; while the node is down none reaches the API (kept for later)."""
        if not self.ready.is_set():
            self.deferred.append((ns, name, edit))
            return
        await self.store.change(ns, "pods", name, edit)

    # Scheduling.

    def short_of(self, wanted: dict[str, float]) -> list[str]:
        used: dict[str, float] = {}
        for req in self.bound.values():
            for key, value in req.items():
                used[key] = used.get(key, 0.0) + value
        return [
            key
            for key, value in sorted(wanted.items())
            if value > 0 and used.get(key, 0.0) + value > self.allocatable.get(key, 0.0) + 1e-9
        ]

    async def schedule_all(self) -> None:
        for (ns, plural, name), obj in sorted(self.store.objects.items()):
            if (
                plural == "pods"
                and not obj["spec"].get("nodeName")
                and not obj["metadata"].get("deletionTimestamp")
            ):
                await self.schedule(ns, name)

    async def schedule(self, ns: str, name: str) -> None:
        pod = self.store.get(ns, "pods", name)
        if pod is None or pod["spec"].get("nodeName"):
            return
        wanted = pod_requests(pod)
        missing = self.short_of(wanted)
        if missing or not self.ready.is_set():
            words = ", ".join(f"1 Insufficient {key}" for key in missing)
            if not self.ready.is_set():
                words = "1 node(s) had untolerated taint {node.kubernetes.io/unreachable: }"
            message = (
                f"0/1 nodes are available: {words}. preemption: 0/1 nodes are available: "
                "1 No preemption victims found for incoming pod."
            )
            current = (pod.get("status") or {}).get("conditions") or []
            if not current or current[0].get("message") != message:
                await self.store.change(ns, "pods", name, lambda p: p.update(status={
                    "phase": "Pending", "qosClass": "Guaranteed",
                    "conditions": [condition("PodScheduled", False, "Unschedulable", message)],
                }))  # fmt: skip
            return
        self.bound[(ns, name)] = wanted

        def bind(p: dict[str, Any]) -> None:
            p["spec"]["nodeName"] = NODE
            p["status"] = {
                "phase": "Pending",
                "conditions": [condition("PodScheduled", True)],
                "hostIP": "127.0.0.1",
                "podIP": "127.0.0.1",
                "startTime": now(),
                "qosClass": "Guaranteed",
                "initContainerStatuses": [
                    waiting(c, "PodInitializing") for c in p["spec"].get("initContainers", [])
                ],
                "containerStatuses": [
                    waiting(c, "ContainerCreating") for c in p["spec"]["containers"]
                ],
            }
            if not p["status"]["initContainerStatuses"]:
                del p["status"]["initContainerStatuses"]

        await self.store.change(ns, "pods", name, bind)
        run = PodRun(self, ns, name)
        self.runs[(ns, name)] = run
        run.task = asyncio.get_running_loop().create_task(self.supervise(run))

    async def supervise(self, run: PodRun) -> None:
        try:
            await run.run()
        finally:
            self.bound.pop((run.ns, run.name), None)
            run.ended.set()
            await self.schedule_all()

    # Ends.

    async def delete(self, ns: str, name: str, grace: float) -> None:
        """A pod's deletion: its containers stopped within the grace period, its final status
        written, then it leaves; on a node that is down it waits for the node."""
        run = self.runs.get((ns, name))
        if run is not None:
            await run.stop("Deleted", grace)
            await run.ended.wait()
        await self.ready.wait()
        self.runs.pop((ns, name), None)
        self.bound.pop((ns, name), None)
        if self.on_gone is not None:
            await self.on_gone(ns, name)
        await self.schedule_all()

    async def set_ready(
        self, ready: bool, toleration: float, evict: Callable[[str, str], Any]
    ) -> None:
        """NotReady: the node lost power (its containers die, its kubelet is silent); the node
        lifecycle controller marks its pods not Ready, and the taint manager evicts them after
        the toleration (node.kubernetes.io/unreachable, tolerationSeconds 300 by default)."""
        if ready:
            self.ready.set()
            deferred, self.deferred = self.deferred, []
            for ns, name, edit in deferred:
                await self.store.change(ns, "pods", name, edit)
            await self.schedule_all()
            return
        if not self.ready.is_set():
            return
        self.ready.clear()
        for (ns, name), run in list(self.runs.items()):
            await self.store.change(
                ns,
                "pods",
                name,
                lambda p: set_condition(p, condition("Ready", False, "NodeNotReady")),
            )
            await run.power_off()
        asyncio.get_running_loop().create_task(self.taint_eviction(toleration, evict))

    async def taint_eviction(self, toleration: float, evict: Callable[[str, str], Any]) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.ready.wait(), toleration)
        if self.ready.is_set():
            return
        for ns, name in list(self.runs):
            await evict(ns, name)

    async def remove_all(self) -> None:
        process = await asyncio.create_subprocess_exec(
            *podman.remove_all_argv(self.podman, self.label),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await process.wait()

    def log_path(self, pod: dict[str, Any], container: str) -> Path:
        return self.folder(pod) / "containers" / container / "log"
