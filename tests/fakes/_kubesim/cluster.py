"""What the API server does to objects, apart from HTTP: creates through admission, graceful
pod deletion, disruptions (eviction, preemption, the taint manager), and the garbage
collector's removal of what a deleted pod owned."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from . import admission
from .faults import Faults
from .kubelet import Node, condition, set_condition
from .store import CLUSTER, KINDS, Store, merge_patch, now, status_body

Answer = tuple[int, dict[str, Any]]


class Cluster:
    """The store, the node, and the faults the next requests meet."""

    def __init__(self, store: Store, node: Node, toleration: float) -> None:
        self.store = store
        self.node = node
        self.toleration = toleration
        self.faults = Faults()
        node.on_gone = self.gone

    async def create(
        self, ns: str, plural: str, obj: dict[str, Any], strict: bool = False
    ) -> Answer:
        """POST: admission, then the object stored (201), or a Status."""
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
            return 400, status_body(400, "BadRequest", "the body is not an object with metadata")
        refusal = admission.admit(self.store, ns, plural, obj, strict)
        if refusal is not None:
            code, reason, message = refusal
            name = obj["metadata"].get("name", "")
            return code, status_body(code, reason, message, name=name, kind=plural)
        name = obj["metadata"]["name"]
        if self.store.get(ns, plural, name) is not None:
            message = f'{plural} "{name}" already exists'
            return 409, status_body(409, "AlreadyExists", message, name=name, kind=plural)
        obj = self.store.stamp(ns, plural, copy.deepcopy(obj))
        if plural == "pods":
            obj["status"] = {"phase": "Pending", "qosClass": "Guaranteed"}
        await self.store.write(ns, plural, "ADDED", obj)
        if plural == "pods":
            await self.node.schedule(ns, name)
        self.sources_changed(ns, plural)
        return 201, self.store.get(ns, plural, name) or obj

    async def patch(self, ns: str, plural: str, name: str, patch: dict[str, Any]) -> Answer:
        obj = self.store.get(ns, plural, name)
        if obj is None:
            return 404, status_body(404, "NotFound", f'{plural} "{name}" not found')
        merged = merge_patch(obj, patch)
        merged["metadata"].update(
            {
                k: obj["metadata"][k]
                for k in ("uid", "name", "creationTimestamp")
                if k in obj["metadata"]
            }
        )
        await self.store.write(ns, plural, "MODIFIED", merged)
        self.sources_changed(ns, plural)
        return 200, merged

    def sources_changed(self, ns: str, plural: str) -> None:
        """The kubelet's sync of mounted ConfigMaps and Secrets."""
        if plural in ("configmaps", "secrets"):
            for (run_ns, _), run in self.node.runs.items():
                if run_ns == ns:
                    run.refresh()

    async def delete(self, ns: str, plural: str, name: str, grace: float | None) -> Answer:
        """DELETE: other objects leave at once; a pod bound to the node gets its
        deletionTimestamp and leaves once the kubelet has stopped it (grace 0: at once)."""
        obj = self.store.get(ns, plural, name)
        if obj is None:
            return 404, status_body(404, "NotFound", f'{plural} "{name}" not found')
        if plural != "pods":
            await self.remove(ns, plural, obj)
            return 200, obj
        seconds = float(
            grace if grace is not None else obj["spec"].get("terminationGracePeriodSeconds", 30)
        )
        if not obj["spec"].get("nodeName") or seconds == 0:
            run = self.node.runs.get((ns, name))
            if run is not None:
                asyncio.get_running_loop().create_task(run.power_off())
            await self.gone(ns, name)
            return 200, obj
        if not obj["metadata"].get("deletionTimestamp"):

            def mark(p: dict[str, Any]) -> None:
                # The time by which the pod should be gone: the request's time plus its grace.
                p["metadata"]["deletionTimestamp"] = now(seconds)
                p["metadata"]["deletionGracePeriodSeconds"] = int(seconds)

            obj = await self.store.change(ns, "pods", name, mark) or obj
            asyncio.get_running_loop().create_task(self.node.delete(ns, name, seconds))
        return 200, obj

    async def disrupt(
        self, ns: str, name: str, reason: str, message: str, grace: float | None = None
    ) -> Answer:
        """The DisruptionTarget condition, then a graceful delete (the eviction API, the
        scheduler's preemption and the taint manager all do this)."""
        edit = lambda p: set_condition(p, condition("DisruptionTarget", True, reason, message))  # noqa: E731
        if await self.store.change(ns, "pods", name, edit) is None:
            return 404, status_body(404, "NotFound", f'pods "{name}" not found')
        return await self.delete(ns, "pods", name, grace)

    async def evict(self, ns: str, name: str, grace: float | None) -> Answer:
        code, body = await self.disrupt(
            ns, name, "EvictionByEvictionAPI", "Eviction API: evicting", grace
        )
        if code != 200:
            return code, body
        return 201, {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "code": 201,
        }

    async def taint_evict(self, ns: str, name: str) -> None:
        await self.disrupt(
            ns, name, "DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint"
        )

    async def set_node_ready(self, ready: bool) -> None:
        await self.node.set_ready(ready, self.toleration, self.taint_evict)

    async def gone(self, ns: str, name: str) -> None:
        self.node.runs.pop((ns, name), None)
        self.node.bound.pop((ns, name), None)
        pod = self.store.get(ns, "pods", name)
        if pod is not None:
            await self.remove(ns, "pods", pod)

    async def remove(self, ns: str, plural: str, obj: dict[str, Any]) -> None:
        """The object leaves; then, as the garbage collector's background deletion, every object
        whose ownerReferences name it."""
        await self.store.write(ns, plural, "DELETED", copy.deepcopy(obj))
        uid = obj["metadata"].get("uid")
        for (n, p, _), other in list(self.store.objects.items()):
            owners = other["metadata"].get("ownerReferences") or []
            if n == ns and any(o.get("uid") == uid for o in owners):
                if p == "pods":
                    await self.delete(n, p, other["metadata"]["name"], None)
                else:
                    await self.remove(n, p, other)

    def namespace(self, name: str, labels: dict[str, str]) -> dict[str, Any]:
        obj = self.store.stamp(
            CLUSTER, "namespaces", {"metadata": {"name": name, "labels": labels}}
        )
        obj["status"] = {"phase": "Active"}
        return obj

    def known(self, plural: str) -> bool:
        return plural in KINDS
