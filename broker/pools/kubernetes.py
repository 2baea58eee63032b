"""The Kubernetes pool: each task is one pod in the pool's namespace, running the same runner
zipapp as every other pool (delivered in a ConfigMap, run by the image's python), its task.json
in a Secret of its own, reporting to the control plane over HTTP.

The driver follows all of the pool's pods with one list-then-watch (resumed from its
resourceVersion, listed again after 410 Gone), not a request per pod; it reads task states from
the pod table in kube_states.py, deletes a finished task's pod once its end is recorded and its
log saved, and after a restart adopts the pods it finds by their labels. Docs:
docs/kubernetes.md (the Role it needs, the templates, the GPU forms).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import os
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from broker.domain import Pool, Task, TaskState
from broker.errors import KliqueError, SubmitError, TemplateError, TransportError
from broker.execution import Observation, PoolState, Submission
from broker.pools import kube_pod, kube_states
from broker.pools.base import Context, PoolDriver
from broker.pools.kube_api import Conflict, Gone, KubeApi, KubeError
from broker.pools.registry import PoolKindSpec
from broker.pools.settings import PoolSettings, settings_as
from broker.templates import search_roots
from broker.units import Seconds, SizeMB
from inside_job import imageref

log = logging.getLogger("klique.pools")

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
LABEL_VALUE = r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
_CONFIG_MAP_MAX = 1024 * 1024  # a ConfigMap's data, all keys together (etcd's object limit)


class KubernetesSettings(PoolSettings):
    kind: Literal["kubernetes"]
    namespace: str = Field(pattern=DNS_LABEL)
    # The API server: a URL, or a kubeconfig file (and context); neither: in-cluster.
    server: str | None = None
    kubeconfig: str | None = None
    kube_context: str | None = None
    token_file: str | None = None  # with server: a service account's token, and the cluster's CA
    ca_file: str | None = None
    image: str = Field("python:3.12-slim", pattern=r"^[A-Za-z0-9/][A-Za-z0-9._/:@+-]{0,254}$")
    job_root: str = "/klique/job"  # the runner's folder inside each pod (an emptyDir)
    pod_template: str = Field("pod", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    gpu_resource: str = "nvidia.com/gpu"
    mig_resource: str | None = None  # fractions and GPU-memory requests take one MIG slice
    shared_gpu_resource: str | None = None  # else one time-sliced replica, memory capped
    gpu_memory: SizeMB = 0  # memory of one GPU: what a fraction's cap is computed from
    max_queued: int = Field(100, ge=1)
    max_wait: Seconds | None = None
    run_as_user: int = Field(1000, ge=1)  # never root
    delete_grace: Seconds = 30
    lost_after: Seconds = 120
    report_url: str | None = None  # where pods reach the control plane (unset: the server's)
    installation: str | None = Field(None, pattern=LABEL_VALUE)


POOL_KIND = PoolKindSpec(
    name="kubernetes",
    settings=KubernetesSettings,
    driver="broker.pools.kubernetes:KubernetesDriver",
    queueing=True,
    summary="a Kubernetes namespace: one pod per task, one list-then-watch per pool",
)


def installation_id(home: Path, configured: object) -> str:
    """Klique's installation id: the pool's setting, else one made once in the server's home."""
    if configured:
        return str(configured)
    path = home / "installation-id"
    with contextlib.suppress(FileNotFoundError):
        return path.read_text(encoding="ascii").strip()
    home.mkdir(parents=True, exist_ok=True)
    made = secrets.token_hex(8)
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(made + "\n")
    return path.read_text(encoding="ascii").strip()


class KubernetesDriver(PoolDriver):
    settings: KubernetesSettings

    def __init__(self, pool: Pool, context: Context, api: KubeApi | None = None) -> None:
        super().__init__(pool, context)
        self.settings = s = settings_as(pool, KubernetesSettings)
        self.namespace = s.namespace
        self.job_root = s.job_root
        self.api = api or KubeApi(
            self.namespace,
            server=_opt(s.server),
            kubeconfig=_opt(s.kubeconfig),
            context=_opt(s.kube_context),
            token_file=_opt(s.token_file),
            ca_file=_opt(s.ca_file),
        )
        self._installation = _opt(s.installation)
        self.forms = kube_pod.GpuForms(
            whole=s.gpu_resource,
            mig=_opt(s.mig_resource),
            shared=_opt(s.shared_gpu_resource),
            gpu_memory_mb=pool.gpu_memory_mb,  # the estate keeps `gpu_memory` on the Pool
        )
        self.lost_after_s = float(s.lost_after)
        self.grace_s = s.delete_grace
        self.pods: dict[str, dict[str, Any]] = {}  # by name, as the watch last showed them
        self.resource_version: str | None = None
        self.lists = 0  # how often the pods were listed (once, plus once per 410 Gone)
        self.watch_error = ""
        self._synced = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None
        self._missing_since: dict[int, float] = {}
        self._runner_map: str | None = None

    # Names.

    @property
    def installation(self) -> str:
        """Klique's installation id, in every pod's labels (made on first use)."""
        if self._installation is None:
            self._installation = installation_id(self.context.home, None)
        return self._installation

    @property
    def selector(self) -> dict[str, str]:
        """The labels of every pod of this pool and installation."""
        return {kube_pod.LABEL_POOL: self.pool.name, kube_pod.LABEL_INSTALLATION: self.installation}

    def new_job_dir(self, task: Task) -> str:
        """The runner's folder in the pod, named as the pod is: the tag and the attempt."""
        return f"{self.job_root.rstrip('/')}/{pod_name(task)}"

    def account(self, task: Task) -> str:
        """A user_map, when the pool has one, says who may use the pool; pods run as the
        pool's run_as_user whoever the owner is."""
        if self.pool.user_map.maps_anyone:
            return super().account(task)
        return task.owner

    def check_account(self) -> str | None:
        return None

    # Start-up.

    async def check(self) -> list[str]:
        """Whether this account may follow the namespace's pods (a look, nothing made). An
        API that does not answer is no problem found: the pool's agent shows it unreachable
        (the watch's error) until it answers."""
        try:
            await self.api.list_pods({kube_pod.LABEL_POOL: self.pool.name})
        except TransportError as exc:
            log.warning("pool %s: start-up check could not run: %s", self.pool.name, exc)
            return []
        except KubeError as exc:
            self.problems = [
                f"namespace {self.namespace}: {exc}; fix: apply the Role and RoleBinding of "
                "broker/deploy/kubernetes-rbac.yaml (docs/kubernetes.md) for the pool's account"
            ]
        else:
            self.problems = []
        return self.problems

    async def runner_config_map(self) -> str:
        """The ConfigMap holding this server's runner, made once (named by its digest)."""
        if self._runner_map is not None:
            return self._runner_map
        data = self.context.runner.read_bytes()
        name = f"klique-runner-{hashlib.sha256(data).hexdigest()[:16]}"
        encoded = base64.b64encode(data).decode()
        if len(encoded) > _CONFIG_MAP_MAX:
            raise SubmitError(
                f"the runner ({len(data)} bytes) does not fit a ConfigMap (1 MiB); fix: "
                "deliver it with an init container in the pool's pod template"
            )
        if await self.api.get_config_map(name) is None:
            manifest = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "labels": dict(self.selector)},
                "binaryData": {kube_pod.RUNNER_FILE: encoded},
                "immutable": True,
            }
            with contextlib.suppress(Conflict):
                await self.api.create(manifest)
        self._runner_map = name
        return name

    # Rendering.

    def request(self, task: Task, job_dir: str | None = None) -> kube_pod.PodRequest:
        profile = self.context.estate.resources[task.resource].profile
        name = pod_name(task)
        return kube_pod.PodRequest(
            name=name,
            task_id=task.id,
            attempt=max(task.attempts, 1),
            pool=self.pool.name,
            installation=self.installation,
            image=self.image(task),
            python=self.settings.python or "python3",
            job_dir=job_dir or task.job_dir or self.new_job_dir(task),
            secret=f"{name}-task",
            runner_config_map=self._runner_map or "klique-runner",
            cpus=profile.cpus,
            memory_mb=profile.memory_mb,
            walltime_s=profile.walltime_s,
            gpus=profile.gpus,
            gpu_fraction=profile.gpu_fraction,
            gpu_memory_mb=profile.gpu_memory_mb,
            run_as_user=self.settings.run_as_user,
        )

    def image(self, task: Task) -> str:
        """The task's image (checked: a reference, nothing else), else the pool's."""
        if not task.spec.image:
            return self.settings.image
        try:
            return imageref.check(task.spec.image).removeprefix("docker://")
        except imageref.ImageError as exc:
            raise TemplateError(str(exc)) from exc

    def base_template(self) -> Path:
        roots = search_roots(self.context.estate.templates_dir)
        return kube_pod.find_base(self.settings.pod_template, roots)

    def render(self, task: Task, job_dir: str | None = None) -> dict[str, Any]:
        """The pod: the base template, the compute resource's overrides, Klique's fields."""
        roots = search_roots(self.context.estate.templates_dir)
        base = kube_pod.load_yaml(self.base_template())
        found = kube_pod.find_overrides(task.resource, roots)
        overrides = kube_pod.load_yaml(found) if found else None
        return kube_pod.render_pod(self.request(task, job_dir), self.forms, base, overrides)

    def task_document(
        self, task: Task, report_token: str, gpus: Sequence[int] | None = None
    ) -> dict[str, Any]:
        document = super().task_document(task, report_token, gpus)
        document["image"] = None  # the pod runs in the image already
        document["runtime"] = None
        url = self.settings.report_url
        if url and document["report"]:
            document["report"]["url"] = str(url)
        cap = kube_pod.memory_cap_mb(self.request(task), self.forms)
        if cap is not None:
            document["gpu_memory_limit_mb"] = cap
        return document

    # The pool's side of the scheduler.

    async def submit(self, task: Task, report_token: str) -> Submission:
        self.account(task)  # an unmapped user is refused before anything is made
        await self.runner_config_map()
        job_dir = str(task.job_dir)
        pod = self.render(task, job_dir)
        request = self.request(task, job_dir)
        document = self.task_document(task, report_token)
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": request.secret, "labels": kube_pod.labels(request)},
            "type": "Opaque",
            "data": {kube_pod.TASK_FILE: base64.b64encode(json.dumps(document).encode()).decode()},
        }
        with contextlib.suppress(Conflict):  # a retried attempt: the same token's digest
            await self.api.delete("Secret", request.secret)
        await self.api.create(secret)
        try:
            created = await self.api.create(pod)
        except Conflict as exc:
            if not self._ours(self.pods.get(request.name), task):
                raise SubmitError(
                    f"a pod named {request.name} exists in namespace {self.namespace} and is not "
                    "this task's: one namespace serves one Klique installation"
                ) from exc
        except KubeError:  # refused: its Secret goes too (unreachable: it may have been made)
            await self.api.delete("Secret", request.secret)
            raise
        else:
            self._seen(created)
        return Submission(native_id=request.name, job_dir=job_dir)

    def _ours(self, pod: dict[str, Any] | None, task: Task) -> bool:
        labels = ((pod or {}).get("metadata") or {}).get("labels") or {}
        return bool(labels.get(kube_pod.LABEL_TASK) == str(task.id))

    async def capacity(self, active: Sequence[Task]) -> PoolState:
        waiting = sum(1 for t in active if t.state is not TaskState.RUNNING)
        error = "; ".join(self.problems) or self.watch_error
        return PoolState(self.pool.name, queued=waiting, reachable=not error, reason=error)

    async def poll(self, tasks: Sequence[Task]) -> dict[int, Observation]:
        self._follow()
        if not self._synced.is_set():
            return {}
        news: dict[int, Observation] = {}
        for task in tasks:
            seen = self._observe(task)
            if seen is not None and (seen.state != task.state or seen.reason != task.reason):
                news[task.id] = seen
        await self._clean_up({pod_name(t) for t in tasks if t.job_dir})
        return news

    def _observe(self, task: Task) -> Observation | None:
        if task.job_dir is None:
            return None
        pod = self.pods.get(pod_name(task))
        if task.state is TaskState.PLACED:  # its submission's outcome was never recorded
            if pod is not None:
                return Observation(
                    TaskState.SUBMITTED, native_id=pod_name(task), job_dir=task.job_dir
                )
            return Observation(TaskState.QUEUED, "its pod was never created; creating it again")
        if pod is None:
            return self._missing(task)
        self._missing_since.pop(task.id, None)
        if (pod.get("metadata") or {}).get("deletionTimestamp") and task.preempted:
            return Observation(TaskState.FAILED, "preempted", preempted=True)
        seen = kube_states.observe(pod)
        if seen is None:
            return self._missing(task)  # Unknown: its node is not answering
        return seen

    def _missing(self, task: Task) -> Observation | None:
        if task.preempted:
            return Observation(TaskState.FAILED, "preempted", preempted=True)
        first = self._missing_since.setdefault(task.id, time.monotonic())
        if time.monotonic() - first < self.lost_after_s:
            return None
        return Observation(
            TaskState.LOST, f"its pod {pod_name(task)} is gone (deleted outside Klique?)"
        )

    async def _clean_up(self, followed: set[str]) -> None:
        """Delete the pods of tasks whose end is recorded (no longer followed), their log
        saved first; a pod that still runs for a task Klique no longer follows is left alone."""
        for name, pod in list(self.pods.items()):
            if _task_label(pod) is None or name in followed:
                continue
            if (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue
            seen = kube_states.observe(pod)
            if seen is None or not seen.state.final:
                continue
            await self._save_log(name)
            await self.api.delete("Pod", name, grace_s=0)
            await self.api.delete("Secret", f"{name}-task")

    async def _save_log(self, name: str) -> None:
        """The pod's log (the runner's own output), kept in the server's home."""
        try:
            text = await self.api.pod_log(name)
        except KliqueError as exc:
            text = f"(no log: {exc})\n"
        folder = self.context.home / "pod-logs" / self.pool.name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.log").write_text(text, encoding="utf-8")

    async def cancel(self, task: Task) -> None:
        name = task.native_id or (pod_name(task) if task.job_dir else None)
        if not name:
            return
        await self.api.delete("Pod", name, grace_s=self.grace_s)
        await self.api.delete("Secret", f"{name}-task")

    async def preempt(self, task: Task) -> None:
        await self.cancel(task)  # the pod's end (deleted, while preempted) requeues the task

    async def read_console(
        self, task: Task, offset: int, limit: int, rank: int = 0
    ) -> bytes | None:
        return None  # the runner reports its console over HTTP; the server keeps that copy

    # Following the pods: one list, then one watch from its resourceVersion.

    def _follow(self) -> None:
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch_loop())

    async def _watch_loop(self) -> None:
        backoff = 1.0
        while True:
            try:
                await self._list()
                assert self.resource_version is not None
                async for kind, pod in self.api.watch_pods(self.selector, self.resource_version):
                    self._apply(kind, pod)
                    backoff = 1.0
            except Gone:
                log.info(
                    "pool %s: the watch's resourceVersion expired; listing again", self.pool.name
                )
            except Exception as exc:  # the API's refusal, or an answer that cannot be read
                words = str(exc) if isinstance(exc, KliqueError) else f"{type(exc).__name__}: {exc}"
                self.watch_error = f"following the pods: {words}"
                log.warning("pool %s: %s", self.pool.name, self.watch_error)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def _list(self) -> None:
        pods, version = await self.api.list_pods(self.selector)
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.resource_version = version
        self.lists += 1
        self.watch_error = ""
        self._synced.set()

    def _apply(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        self.resource_version = pod["metadata"].get("resourceVersion") or self.resource_version
        if kind == "DELETED":
            self.pods.pop(name, None)
        elif kind in ("ADDED", "MODIFIED"):
            self._seen(pod)

    def _seen(self, pod: dict[str, Any]) -> None:
        """Keep the newer of two versions of a pod (a create's answer may trail the watch)."""
        name = pod["metadata"]["name"]
        known = self.pods.get(name)
        if known is None or _version(pod) >= _version(known):
            self.pods[name] = pod

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(BaseException):
                await self._watcher
        with contextlib.suppress(Exception):
            await self.api.close()


def pod_name(task: Task) -> str:
    """klique-<task>-<attempt>: the tag and the attempt (the job folder's name, once chosen)."""
    if task.job_dir:
        return task.job_dir.rstrip("/").rsplit("/", 1)[-1]
    return f"{task.tag}-{max(task.attempts, 1)}"


def _task_label(pod: dict[str, Any]) -> int | None:
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(kube_pod.LABEL_TASK)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _version(pod: dict[str, Any]) -> int:
    """resourceVersions are opaque to clients; compared only to prefer the newer of two copies
    of one pod, where both are integers (as etcd's revisions are), else the later one wins."""
    value = (pod.get("metadata") or {}).get("resourceVersion") or ""
    return int(value) if str(value).isdigit() else 1 << 62


def _opt(value: object) -> str | None:
    return str(value) if value else None
