"""The Kubernetes pool: each task is one pod in the pool's namespace, running the same runner
zipapp as every other pool (delivered in a ConfigMap, run by the image's python), its task.json
in a Secret of its own, reporting to the control plane over HTTP.

The driver is the flow of a task's pod; each step is a module of its own. The pool's settings
(kube_settings.py); its pod templates, rendered and checked for privileges (kube_templates.py);
the runner and task.json given to each pod (kube_delivery.py); pods made idempotently, waiting
out quota, throttling and server errors (kube_create.py); all of the pool's pods followed with
one list-then-watch (kube_follow.py), not a request per pod; task states read from the pod by
the rules of kube_states.py (disruptions requeue, a lost node ends the attempt lost, an image
pull fails only after its back-off lasted); after a restart, a pod found by its name adopted
(kube_adopt.py); a finished task's pod deleted once its end is recorded and its log saved
(kube_finish.py). With `admission: kueue` each attempt is a suspended Job that Kueue admits
(kueue.py, kueue_waits.py). Docs: docs/kubernetes.md (the templates, Pod Security, failures,
Kueue).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from broker.domain import Pool, Task, TaskState
from broker.errors import SubmitUnknown, TemplateError, TransportError
from broker.execution import Observation, PoolState, Submission
from broker.pools import kube_delivery, kube_finish, kube_pod, kube_states, kube_templates, kueue
from broker.pools.base import Context, PoolDriver
from broker.pools.kube_adopt import adopt
from broker.pools.kube_api import KubeApi, KubeError
from broker.pools.kube_create import Creation, Creations
from broker.pools.kube_follow import PodFollower
from broker.pools.kube_settings import KubernetesSettings, installation_id
from broker.pools.kueue_waits import KueueWaits
from broker.pools.reconcile import NEVER_RAN_TRIES
from broker.pools.registry import PoolKindSpec
from broker.pools.settings import settings_as
from inside_job import imageref

log = logging.getLogger("klique.pools")

POOL_KIND = PoolKindSpec(
    name="kubernetes",
    settings=KubernetesSettings,
    driver="broker.pools.kubernetes:KubernetesDriver",
    queueing=True,
    summary="a Kubernetes namespace: one pod per task, one list-then-watch per pool",
)


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
        self.follower = PodFollower(self.api, pool.name, lambda: self.selector)
        self._missing_since: dict[int, float] = {}
        self._pull_since: dict[int, float] = {}  # by task: in ImagePullBackOff since
        self._ended: set[str] = set()  # pods whose task Klique ended while they wait on
        self._runner_map: str | None = None
        self.kueue = s.admission == "kueue"
        seen = self.follower.seen
        self.creations = Creations(self.api, pool.name, self.namespace, self.kueue, seen)
        self.kueue_waits = KueueWaits(self.api, pool.name)

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
        templates = kube_templates.template_problems(
            self.pool.name, self.settings, self.context.estate
        )
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
        if self._runner_map is None:
            runner = self.context.runner.read_bytes()
            self._runner_map = await kube_delivery.deliver_runner(self.api, runner, self.selector)
        return self._runner_map

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
        return kube_templates.base_template(self.settings, self.context.estate)

    def render(self, task: Task, job_dir: str | None = None) -> dict[str, Any]:
        """The pod: the base template, the compute resource's overrides, Klique's fields."""
        base, overrides = kube_templates.load(self.settings, self.context.estate, task.resource)
        return kube_pod.render_pod(
            self.request(task, job_dir),
            self.forms,
            base,
            overrides,
            allow_privileged=self.settings.allow_privileged_templates,
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
        secret = kube_delivery.task_secret(request, self.task_document(task, report_token))
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

    def outcome_unknown(self, task_id: int) -> str | None:
        creation = self.creations.pending.get(task_id)
        return creation.reason or None if creation is not None else None

    async def capacity(self, active: Sequence[Task]) -> PoolState:
        waiting = sum(1 for t in active if t.state is not TaskState.RUNNING)
        error = "; ".join(self.problems) or self.follower.error
        return PoolState(self.pool.name, queued=waiting, reachable=not error, reason=error)

    async def poll(self, tasks: Sequence[Task]) -> dict[int, Observation]:
        self.follower.follow()
        await self.creations.retry({t.id for t in tasks})
        if not self.follower.synced.is_set():
            return {}
        if self.kueue:
            pods = self.follower.pods
            await self.kueue_waits.look({n for n in self._followed(tasks) if n not in pods})
        news: dict[int, Observation] = {}
        for task in tasks:
            seen = await self._observe(task)
            if seen is not None and (seen.state != task.state or seen.reason != task.reason):
                news[task.id] = seen
        await self._clean_up(self._followed(tasks))
        return news

    @staticmethod
    def _followed(tasks: Sequence[Task]) -> set[str]:
        """The pods (or Jobs) of the tasks followed here, by name."""
        return {pod_name(t) for t in tasks if t.job_dir}

    async def _observe(self, task: Task) -> Observation | None:
        if task.job_dir is None:
            return None
        name = pod_name(task)
        creation = self.creations.pending.get(task.id)
        if creation is not None:
            told = self.creations.told(task, creation)
            if told is not None or not creation.done:
                return told
        pod = self.follower.pods.get(name)
        if task.state is TaskState.PLACED:  # its submission's outcome was never recorded
            return await adopt(self.api, task, name, pod, self._kind)
        if pod is None and name in self.kueue_waits.words:
            return Observation(TaskState.PENDING, self.kueue_waits.words[name])
        if pod is None:
            gone = self.follower.gone.get(name)
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
        saved first (kube_finish.py)."""
        self.follower.forget_gone(followed)
        folder = self.context.home / "pod-logs" / self.pool.name
        for name, pod in kube_finish.finished(self.follower.pods, followed, self._ended):
            self._ended.discard(name)
            await kube_finish.save_log(self.api, folder, name, pod)
            await kube_finish.delete(self.api, self._kind, name, grace_s=0)

    async def cancel(self, task: Task) -> None:
        self.creations.pending.pop(task.id, None)  # a create still waiting is not tried again
        name = task.native_id or (pod_name(task) if task.job_dir else None)
        if not name:
            return
        await kube_finish.delete(self.api, self._kind, name, grace_s=self.grace_s)

    @property
    def _kind(self) -> str:
        """What a task's attempt is in the cluster: a pod, or the Job holding it (Kueue)."""
        return "Job" if self.kueue else "Pod"

    async def preempt(self, task: Task) -> None:
        await self.cancel(task)  # the pod's end (deleted, while preempted) requeues the task

    async def read_console(
        self, task: Task, offset: int, limit: int, rank: int = 0
    ) -> bytes | None:
        return None  # the runner reports its console over HTTP; the server keeps that copy

    async def close(self) -> None:
        await self.follower.close()
        with contextlib.suppress(Exception):
            await self.api.close()


def pod_name(task: Task) -> str:
    """klique-<task>-<attempt>: the tag and the attempt (the job folder's name, once chosen)."""
    if task.job_dir:
        return task.job_dir.rstrip("/").rsplit("/", 1)[-1]
    return f"{task.tag}-{max(task.attempts, 1)}"


def _opt(value: object) -> str | None:
    return str(value) if value else None
