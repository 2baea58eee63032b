"""Following a Kubernetes pool's pods: one list, then one watch from its resourceVersion
(resumed by the API client, listed again after 410 Gone), so the driver reads every pod from
memory instead of asking the API for each (docs/kubernetes.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from broker.errors import KliqueError
from broker.pools import kube_states, kueue
from broker.pools.kube_api import Gone, KubeApi

log = logging.getLogger("klique.pools")

BACKOFF_MOST_S = 30.0  # a failing watch is tried again after 1 s, doubled up to this


class PodFollower:
    """The pods of one pool and installation, by their attempt's name, as the watch last
    showed them; and the disrupted pods deleted before their task's end was read."""

    def __init__(self, api: KubeApi, pool: str, selector: Callable[[], dict[str, str]]) -> None:
        self.api = api
        self.pool = pool
        self._selector = selector  # labels, read when the watch starts (the id is made late)
        self.pods: dict[str, dict[str, Any]] = {}
        self.gone: dict[str, dict[str, Any]] = {}  # disrupted pods deleted, by name
        self.resource_version: str | None = None
        self.lists = 0  # how often the pods were listed (once, plus once per 410 Gone)
        self.error = ""  # why the pods cannot be followed now ("" while they are)
        self.synced = asyncio.Event()  # set once the first list is in
        self._watcher: asyncio.Task[None] | None = None

    def follow(self) -> None:
        """Start the watch, or start it again where it ended."""
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch_loop())

    async def _watch_loop(self) -> None:
        backoff = 1.0
        while True:
            try:
                await self._list()
                assert self.resource_version is not None
                async for kind, pod in self.api.watch_pods(self._selector(), self.resource_version):
                    self.apply(kind, pod)
                    backoff = 1.0
            except Gone:
                log.info("pool %s: the watch's resourceVersion expired; listing again", self.pool)
            except Exception as exc:  # the API's refusal, or an answer that cannot be read
                words = str(exc) if isinstance(exc, KliqueError) else f"{type(exc).__name__}: {exc}"
                self.error = f"following the pods: {words}"
                log.warning("pool %s: %s", self.pool, self.error)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MOST_S)

    async def _list(self) -> None:
        pods, version = await self.api.list_pods(self._selector())
        self.pods = {pod_key(p): p for p in pods}
        self.resource_version = version
        self.lists += 1
        self.error = ""
        self.synced.set()

    def apply(self, kind: str, pod: dict[str, Any]) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""
        name = pod_key(pod)
        self.resource_version = pod["metadata"].get("resourceVersion") or self.resource_version
        if kind == "DELETED":
            self.pods.pop(name, None)
            if kube_states.disruption(pod) is not None:
                self.gone[name] = pod  # its end is read from its last state
        elif kind in ("ADDED", "MODIFIED"):
            self.seen(pod)

    def seen(self, pod: dict[str, Any]) -> None:
        """Keep the newer of two versions of a pod (a create's answer may trail the watch)."""
        name = pod_key(pod)
        known = self.pods.get(name)
        if known is None or _version(pod) >= _version(known):
            self.pods[name] = pod

    def forget_gone(self, followed: set[str]) -> None:
        """Drop the deleted pods of tasks no longer followed: their end is recorded."""
        for name in [n for n in self.gone if n not in followed]:
            del self.gone[name]

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(BaseException):
                await self._watcher


def pod_key(pod: dict[str, Any]) -> str:
    """A pod by its attempt's name: its own, or its Job's (a Job's pods are named by the Job
    controller, `<job>-<suffix>`)."""
    return kueue.job_of(pod) or str(pod["metadata"]["name"])


def _version(pod: dict[str, Any]) -> int:
    """resourceVersions are opaque to clients; compared only to prefer the newer of two copies
    of one pod, where both are integers (as etcd's revisions are), else the later one wins."""
    value = (pod.get("metadata") or {}).get("resourceVersion") or ""
    return int(value) if str(value).isdigit() else 1 << 62
