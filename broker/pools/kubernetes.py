"""The Kubernetes pool: each task is one pod in the pool's namespace, running the same runner
zipapp as every other pool (delivered in a ConfigMap, run by the image's python), its task.json
in a Secret of its own, reporting to the control plane over HTTP.

The driver follows all of the pool's pods with one list-then-watch (resumed from its
resourceVersion, listed again after 410 Gone), not a request per pod; it reads task states from
the pod table and the rules of kube_states.py (disruptions requeue, a lost node ends the
attempt lost, an image pull fails only after its back-off lasted), makes pods idempotently and
waits out quota, throttling and server errors (kube_create.py), deletes a finished task's pod
once its end is recorded and its log saved, and after a restart adopts the pods it finds by
their labels. With `admission: kueue` each attempt is a suspended Job that Kueue admits
(kueue.py). Docs: docs/kubernetes.md (the templates, Pod Security, failures, Kueue).
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
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from broker.domain import Pool, Task, TaskState
from broker.errors import KliqueError, SubmitError, SubmitUnknown, TemplateError, TransportError
from broker.execution import Observation, PoolState, Submission
from broker.pools import kube_pod, kube_states, kueue
from broker.pools.base import Context, PoolDriver
from broker.pools.kube_api import Conflict, Gone, KubeApi, KubeError
from broker.pools.kube_create import Creation, Creations
from broker.pools.reconcile import NEVER_RAN_TRIES
from broker.pools.registry import PoolKindSpec
from broker.pools.settings import PoolSettings, settings_as
from broker.templates import search_roots
from broker.units import Seconds, SizeMB
from inside_job import imageref

log = logging.getLogger("klique.pools")

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
LABEL_VALUE = r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
_CONFIG_MAP_MAX = 1024 * 1024  # a ConfigMap's data, all keys together (etcd's object limit)
KUEUE_LOOK_S = 5.0  # Kueue's Workloads are listed at most this often


class KubernetesSettings(PoolSettings):
    kind: Literal["kubernetes"]
    """Says the pool is a namespace of a Kubernetes cluster."""
    namespace: str = Field(
        pattern=DNS_LABEL, description="The one namespace the pool's pods, Secrets and Jobs go in."
    )
    server: str | None = Field(
        None,
        description="The API server's URL; else `kubeconfig`, else in-cluster (the pod's "
        "service account).",
    )
    kubeconfig: str | None = Field(None, description="A kubeconfig file to reach the cluster by.")
    kube_context: str | None = Field(None, description="The kubeconfig's context to use.")
    token_file: str | None = Field(
        None, description="With `server`: a file holding the service account's token."
    )
    ca_file: str | None = Field(None, description="With `server`: the cluster's CA certificate.")
    image: str = Field(
        "python:3.12-slim",
        pattern=r"^[A-Za-z0-9/][A-Za-z0-9._/:@+-]{0,254}$",
        description="The image of tasks that name none; it needs the `python` interpreter.",
    )
    job_root: str = Field(
        "/klique/job", description="The runner's folder inside each pod (an emptyDir)."
    )
    pod_template: str = Field(
        "pod",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description="The base pod template: `kubernetes/<pod_template>.yaml` in the templates.",
    )
    allow_privileged_templates: bool = Field(
        False,
        description="Let the pod templates add privileges (host namespaces, hostPath, added "
        "capabilities, privileged containers, a service account token); refused otherwise.",
    )
    gpu_resource: str = Field("nvidia.com/gpu", description="The resource name of whole GPUs.")
    mig_resource: str | None = Field(
        None, description="A MIG slice's resource: fractions and GPU-memory requests take one."
    )
    shared_gpu_resource: str | None = Field(
        None, description="Without MIG: one time-sliced replica, its GPU memory capped."
    )
    gpu_memory: SizeMB = Field(
        0, description="The memory of one GPU: what a fraction's cap is computed from."
    )
    max_queued: int = Field(100, ge=1, description="Pods kept Pending in the namespace at most.")
    max_wait: Seconds | None = Field(
        None,
        description="How long a task waits here (pending, or refused by quota) before "
        "it moves to the compute resource's next pool.",
    )
    run_as_user: int = Field(1000, ge=1, description="The uid every pod runs as (never root).")
    delete_grace: Seconds = Field(
        30, description="A cancel's grace period: SIGTERM, then SIGKILL after it."
    )
    lost_after: Seconds = Field(
        120,
        description="A followed pod gone, Unknown, or terminating past its grace this long: "
        "the task is lost.",
    )
    image_pull_backoff: Seconds = Field(
        300,
        description="How long the kubelet may back off pulling a task's image "
        "(ImagePullBackOff) before the task fails.",
    )
    requeue_disrupted: bool = Field(
        True,
        description="A pod evicted or preempted by the cluster (DisruptionTarget) puts its "
        "task back in Klique's queue; false: the task fails.",
    )
    requeue_lost: bool = Field(
        True,
        description="A task lost with its node goes back to Klique's queue (up to 3 attempts).",
    )
    report_url: str | None = Field(
        None, description="Where pods reach the control plane (unset: the server's own URL)."
    )
    installation: str | None = Field(
        None,
        pattern=LABEL_VALUE,
        description="The installation id in every pod's labels (unset: made once in the "
        "server's home).",
    )
    admission: Literal["klique", "kueue"] = Field(
        "klique",
        description="Who admits the pool's work: Klique creates pods itself, or hands "
        "suspended Jobs to Kueue (with `local_queue`).",
    )
    local_queue: str | None = Field(
        None,
        pattern=DNS_LABEL,
        description="With `admission: kueue`: the namespace's LocalQueue the Jobs go to.",
    )

    @model_validator(mode="after")
    def _kueue_needs_a_queue(self) -> KubernetesSettings:
        if self.admission == "kueue" and not self.local_queue:
            raise ValueError(
                "admission: kueue needs local_queue: the LocalQueue's name in the namespace"
            )
        return self


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
        self._pull_since: dict[int, float] = {}  # by task: in ImagePullBackOff since
        self._gone: dict[str, dict[str, Any]] = {}  # disrupted pods deleted, by name
        self._ended: set[str] = set()  # pods whose task Klique ended while they wait on
        self._runner_map: str | None = None
        self.kueue = s.admission == "kueue"
        self.creations = Creations(self.api, pool.name, self.namespace, self.kueue, self._seen)
        self._kueue_waits: dict[str, str] = {}  # by Job: Kueue's words while it waits
        self._kueue_looked = -KUEUE_LOOK_S

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
        (the watch's error) until it answers. A pod template that adds privileges the pool
        does not allow is a problem, whether the API answers or not."""
        templates = self.template_problems()
        if templates:
            self.problems = templates
            return self.problems
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
        return kube_pod.render_pod(
            self.request(task, job_dir),
            self.forms,
            base,
            overrides,
            allow_privileged=self.settings.allow_privileged_templates,
        )

    def template_problems(self) -> list[str]:
        """The pod templates this pool uses (its base, with each of its compute resources'
        overrides) that add privileges the pool does not allow: one sentence per field."""
        if self.settings.allow_privileged_templates:
            return []
        roots = search_roots(self.context.estate.templates_dir)
        try:
            base_path = self.base_template()
            base = kube_pod.load_yaml(base_path)
        except TemplateError as exc:
            return [str(exc)]
        problems = [self._privilege(base_path, field) for field in kube_pod.privileges(base)]
        for name, resource in sorted(self.context.estate.resources.items()):
            found = kube_pod.find_overrides(name, roots)
            if found is None or self.pool.name not in resource.profile.pools:
                continue
            try:
                merged = kube_pod.merge(base, kube_pod.load_yaml(found))
            except TemplateError as exc:
                problems.append(str(exc))
                continue
            problems += [
                self._privilege(found, field)
                for field in kube_pod.privileges(merged)
                if field not in kube_pod.privileges(base)
            ]
        return problems

    def _privilege(self, template: Path, field: str) -> str:
        return (
            f"pool {self.pool.name}: pod template {template}: {field} adds privileges; remove "
            "it, or set allow_privileged_templates: true on the pool to allow it"
        )

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
        """Make the task's pod, then its Secret. A create the cluster answers with a wait
        (quota, 429, 5xx) is accepted all the same: the task waits submitted, with the
        cluster's words, and the next looks try again (kube_create.py)."""
        self.account(task)  # an unmapped user is refused before anything is made
        await self.runner_config_map()
        job_dir = str(task.job_dir)
        request = self.request(task, job_dir)
        pod = self.render(task, job_dir)
        if self.kueue:
            pod = kueue.job_manifest(pod, str(self.settings.local_queue))
        secret = self._secret(request, self.task_document(task, report_token))
        creation = Creation(task.id, request.name, pod, secret)
        self.creations.pending[task.id] = creation
        try:
            await self.creations.create(creation)
        except TransportError as exc:
            # No answer: the pod may have been made. It is looked up by name before anything
            # is created again: now, and at the next looks while the API does not answer.
            creation.reason = f"its pod's creation had no answer ({exc}); looking it up"
            try:
                await self.creations.create(creation)
            except TransportError:
                raise SubmitUnknown(creation.reason) from exc  # stays placed, looked up
            except KubeError as again:
                if not self.creations.waits(creation, again):
                    self.creations.pending.pop(task.id, None)
                    raise
        except KubeError as exc:
            if not self.creations.waits(creation, exc):
                self.creations.pending.pop(task.id, None)
                raise
        except BaseException:
            self.creations.pending.pop(task.id, None)
            raise
        finally:
            creation.in_submit = False
        if creation.done:
            self.creations.pending.pop(task.id, None)
        return Submission(native_id=request.name, job_dir=job_dir)

    def _secret(self, request: kube_pod.PodRequest, document: dict[str, Any]) -> dict[str, Any]:
        data = base64.b64encode(json.dumps(document).encode()).decode()
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": request.secret, "labels": kube_pod.labels(request)},
            "type": "Opaque",
            "data": {kube_pod.TASK_FILE: data},
        }

    def outcome_unknown(self, task_id: int) -> str | None:
        creation = self.creations.pending.get(task_id)
        return creation.reason or None if creation is not None else None

    async def capacity(self, active: Sequence[Task]) -> PoolState:
        waiting = sum(1 for t in active if t.state is not TaskState.RUNNING)
        error = "; ".join(self.problems) or self.watch_error
        return PoolState(self.pool.name, queued=waiting, reachable=not error, reason=error)

    async def poll(self, tasks: Sequence[Task]) -> dict[int, Observation]:
        self._follow()
        await self.creations.retry({t.id for t in tasks})
        if not self._synced.is_set():
            return {}
        if self.kueue:
            await self._ask_kueue(tasks)
        news: dict[int, Observation] = {}
        for task in tasks:
            seen = await self._observe(task)
            if seen is not None and (seen.state != task.state or seen.reason != task.reason):
                news[task.id] = seen
        await self._clean_up({pod_name(t) for t in tasks if t.job_dir})
        return news

    async def _observe(self, task: Task) -> Observation | None:
        if task.job_dir is None:
            return None
        name = pod_name(task)
        creation = self.creations.pending.get(task.id)
        if creation is not None:
            told = self._creating_now(task, creation)
            if told is not None or not creation.done:
                return told
        pod = self.pods.get(name)
        if task.state is TaskState.PLACED:  # its submission's outcome was never recorded
            return await self._placed(task, pod)
        if pod is None and name in self._kueue_waits:
            return Observation(TaskState.PENDING, self._kueue_waits[name])
        if pod is None:
            gone = self._gone.get(name)
            ended = gone is not None and kube_states.disrupted(gone, None, gone=True)
            return self._requeued(ended) if ended else self._missing(task)
        self._missing_since.pop(task.id, None)
        if (pod.get("metadata") or {}).get("deletionTimestamp") and task.preempted:
            return Observation(TaskState.FAILED, "preempted", preempted=True)
        seen = kube_states.observe(pod)
        disrupted = kube_states.disrupted(pod, seen, gone=False)
        if disrupted is not None:
            return self._requeued(disrupted)
        lost = kube_states.node_lost(pod, time.time(), self.lost_after_s)
        if lost is not None:
            return self._lost(task, lost)
        pulling = self._pull(task, pod)
        if pulling is not None:
            return pulling
        if seen is None:
            return self._missing(task, f"its pod {name} is Unknown: its node stopped answering")
        return seen

    def _creating_now(self, task: Task, creation: Creation) -> Observation | None:
        """A task whose pod is being made: waiting with the cluster's words, failed when
        refused for good, found once made (None: no news, or followed by its pod now)."""
        if creation.in_submit:
            return None
        if creation.refused or creation.done:
            del self.creations.pending[task.id]
        if creation.refused:
            if task.state is TaskState.PLACED:
                return Observation(TaskState.QUEUED, creation.refused)
            return Observation(TaskState.FAILED, creation.refused)
        if task.state is TaskState.PLACED:  # outcome_unknown says why meanwhile
            if not creation.done:
                return None
            return Observation(TaskState.SUBMITTED, native_id=creation.name, job_dir=task.job_dir)
        return None if creation.done else Observation(TaskState.PENDING, creation.reason)

    async def _placed(self, task: Task, pod: dict[str, Any] | None) -> Observation:
        """A placed task whose submission was never recorded (the server stopped meanwhile):
        a pod that runs is adopted; one that never started may lack its Secret (made after
        the pod), so it is deleted and the task goes again; none: made again."""
        name = pod_name(task)
        if pod is None:
            if self.kueue:  # its Job may wait in Kueue, never to be found by a pod: it goes
                await self.api.delete("Job", name, grace_s=0)
            return Observation(TaskState.QUEUED, "its pod was never created; creating it again")
        seen = kube_states.observe(pod)
        if seen is not None and seen.state is TaskState.PENDING:
            await self.api.delete(self._kind, name, grace_s=0)
            return Observation(
                TaskState.QUEUED,
                f"its pod {name} never started and may lack its Secret; made again",
            )
        return Observation(TaskState.SUBMITTED, native_id=name, job_dir=task.job_dir)

    def _requeued(self, seen: Observation) -> Observation:
        """A disruption's ending: back to Klique's queue unless the pool says otherwise."""
        if self.settings.requeue_disrupted:
            return seen
        return replace(seen, retry=False)

    def _lost(self, task: Task, words: str) -> Observation:
        """Lost with its node: run again by Klique where the pool allows, a few times (the
        attempt ends lost; the task goes back to the queue with these words)."""
        words = f"lost: {words}"
        if self.settings.requeue_lost and task.attempts < NEVER_RAN_TRIES:
            return Observation(TaskState.LOST, words, retry=True)
        return Observation(TaskState.LOST, f"{words} ({task.attempts} attempts)")

    def _pull(self, task: Task, pod: dict[str, Any]) -> Observation | None:
        """An image pull in back-off fails the task once it has lasted image_pull_backoff."""
        pulling = kube_states.pulling(pod)
        if pulling is None:
            self._pull_since.pop(task.id, None)
            return None
        reason, message = pulling
        now = time.monotonic()
        if reason == kube_states.PULL_BACKOFF:
            self._pull_since.setdefault(task.id, now)
        if task.id not in self._pull_since:
            return None  # the first try: no back-off yet
        since = self._pull_since[task.id]
        limit = float(self.settings.image_pull_backoff)
        given_up = kube_states.pull_given_up(message, now - since, limit)
        if given_up is not None:
            self._ended.add(pod_name(task))  # its pod never ends by itself: deleted after
        return given_up

    def _missing(self, task: Task, words: str | None = None) -> Observation | None:
        if task.preempted:
            return Observation(TaskState.FAILED, "preempted", preempted=True)
        first = self._missing_since.setdefault(task.id, time.monotonic())
        if time.monotonic() - first < self.lost_after_s:
            return None
        if words is not None:
            return self._lost(task, words)
        if task.started_at is None and task.attempts < NEVER_RAN_TRIES:
            # It never ran: a create still waiting when the server restarted (the waits are
            # kept in memory), or a pod deleted before it started. It goes again.
            words = f"its pod {pod_name(task)} never came or went before it ran"
            return Observation(TaskState.LOST, words, retry=True)
        return Observation(
            TaskState.LOST, f"its pod {pod_name(task)} is gone (deleted outside Klique?)"
        )

    async def _clean_up(self, followed: set[str]) -> None:
        """Delete the pods of tasks whose end is recorded (no longer followed), their log
        saved first; a pod that still runs for a task Klique no longer follows is left alone.
        Their Secrets go with them (owned by the pod); deleted by name too, for the Secrets
        of pods made before Secrets had owners."""
        for name in [n for n in self._gone if n not in followed]:
            del self._gone[name]
        for name, pod in list(self.pods.items()):
            if _task_label(pod) is None or name in followed:
                continue
            if (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue
            seen = kube_states.observe(pod)
            if (seen is None or not seen.state.final) and name not in self._ended:
                continue
            self._ended.discard(name)
            await self._save_log(name, pod)
            await self.api.delete(self._kind, name, grace_s=0)
            await self.api.delete("Secret", f"{name}-task")

    async def _save_log(self, name: str, pod: dict[str, Any]) -> None:
        """The task container's log (the runner's own output), kept in the server's home; by
        the container's name, so a template's sidecar takes nothing from it."""
        try:
            real = str((pod.get("metadata") or {}).get("name") or name)  # a Job's pod: its own
            text = await self.api.pod_log(real, kube_pod.RUNNER_CONTAINER)
        except KliqueError as exc:
            text = f"(no log: {exc})\n"
        folder = self.context.home / "pod-logs" / self.pool.name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.log").write_text(text, encoding="utf-8")

    async def cancel(self, task: Task) -> None:
        self.creations.pending.pop(task.id, None)  # a create still waiting is not tried again
        name = task.native_id or (pod_name(task) if task.job_dir else None)
        if not name:
            return
        await self.api.delete(self._kind, name, grace_s=self.grace_s)
        await self.api.delete("Secret", f"{name}-task")

    @property
    def _kind(self) -> str:
        """What a task's attempt is in the cluster: a pod, or the Job holding it (Kueue)."""
        return "Job" if self.kueue else "Pod"

    async def _ask_kueue(self, tasks: Sequence[Task]) -> None:
        """Kueue's words for the Jobs that have no pod yet (one list of Workloads, at most
        every KUEUE_LOOK_S); an answer that cannot be had leaves the last words."""
        waiting = {pod_name(t) for t in tasks if t.job_dir and pod_name(t) not in self.pods}
        now = time.monotonic()
        if not waiting or now - self._kueue_looked < KUEUE_LOOK_S:
            return
        self._kueue_looked = now
        try:
            workloads = await self.api.list_workloads()
        except KliqueError as exc:
            log.info("pool %s: Kueue's workloads: %s", self.pool.name, exc)
            return
        words: dict[str, str] = {}
        for workload in workloads:
            job = kueue.owner_job(workload)
            if job in waiting:
                words[job] = kueue.waiting(workload) or "Kueue: waiting for admission"
        self._kueue_waits = words

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
        self.pods = {_key(p): p for p in pods}
        self.resource_version = version
        self.lists += 1
        self.watch_error = ""
        self._synced.set()

    def _apply(self, kind: str, pod: dict[str, Any]) -> None:
        name = _key(pod)
        self.resource_version = pod["metadata"].get("resourceVersion") or self.resource_version
        if kind == "DELETED":
            self.pods.pop(name, None)
            if kube_states.disruption(pod) is not None:
                self._gone[name] = pod  # its end is read from its last state
        elif kind in ("ADDED", "MODIFIED"):
            self._seen(pod)

    def _seen(self, pod: dict[str, Any]) -> None:
        """Keep the newer of two versions of a pod (a create's answer may trail the watch)."""
        name = _key(pod)
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


def _key(pod: dict[str, Any]) -> str:
    """A pod by its attempt's name: its own, or its Job's (a Job's pods are named by the Job
    controller, `<job>-<suffix>`)."""
    return kueue.job_of(pod) or str(pod["metadata"]["name"])


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
