"""Creating one attempt's pod (or, where Kueue admits the pool's work, its Job) and its
Secret, idempotently, and the waits a cluster asks for on the way (docs/kubernetes.md,
"Failures"): the rules come from kube_states.py, the calls from kube_api.py.

- The name derives from the task and the attempt, so a create tried again cannot make a
  second pod; after a create with no answer the pod is looked up by name before anything is
  created again, and a 409 for this attempt's own pod adopts it.
- The pod first, then its Secret with an ownerReference to the pod's uid (why: `create`).
- A refusal that is a wait (quota, 429, 5xx) is kept with the API's words and tried again
  after a back-off (Retry-After honoured); the task waits in the pool meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.domain import Task, TaskState
from broker.errors import SubmitError, TransportError
from broker.execution import Observation
from broker.pools import kube_pod, kube_states
from broker.pools.kube_api import Conflict, KubeApi, KubeError

log = logging.getLogger("klique.pools")

RETRY_FIRST_S = 2.0  # a refused create's first wait, doubled at each refusal ...
RETRY_MOST_S = 60.0  # ... up to this (a 429's Retry-After is honoured up to it too)


@dataclass
class Creation:
    """One attempt's pod and Secret, while they are not both made: the cluster asked Klique
    to wait (quota, 429, 5xx), or a create had no answer. Kept in memory only: after a
    restart a placed task is found by its pod's name, and a submitted one whose pod never
    came is run again (`_missing`)."""

    task_id: int
    name: str
    pod: dict[str, Any]
    secret: dict[str, Any]
    pod_uid: str | None = None  # made: the Secret is what is left
    sent: bool = False  # a create went out with no answer: look the pod up before another
    done: bool = False  # both made
    in_submit: bool = True  # its submission is under way: the agent does not follow it yet
    failures: int = 0
    next_at: float = 0.0
    reason: str = ""
    refused: str = ""  # a later try was refused for good: the task fails with this


class Creations:
    """One pool's creates not done yet, by task id, and how each is made."""

    def __init__(
        self,
        api: KubeApi,
        pool: str,
        namespace: str,
        kueue: bool,
        seen: Callable[[dict[str, Any]], None],
    ) -> None:
        self.api = api
        self.pool = pool
        self.namespace = namespace
        self.kueue = kueue
        self._seen = seen  # the driver's copy of a pod a create answered with
        self.pending: dict[int, Creation] = {}

    async def create(self, creation: Creation) -> None:
        """The pod first, then its Secret owned by it (ownerReferences: the pod's uid). The
        Secret carries the report token: made with its owner, it never outlives the pod
        (the garbage collector deletes it with the pod, whoever deletes the pod). A crash
        between the two leaves a pod waiting in ContainerCreating for its Secret, with nothing
        secret in it: found by name at the next look and made again (kube_adopt.py)."""
        if creation.pod_uid is None:
            pod = await self._create_pod(creation)
            creation.pod_uid = str((pod.get("metadata") or {}).get("uid") or "")
        owner = {"apiVersion": creation.pod["apiVersion"], "kind": creation.pod["kind"]}
        owner.update(name=creation.name, uid=creation.pod_uid)
        secret = kube_pod.merge(creation.secret, {"metadata": {"ownerReferences": [owner]}})
        with contextlib.suppress(Conflict):  # a retried create whose answer was lost
            await self.api.create(secret)
        creation.done = True

    async def _create_pod(self, creation: Creation) -> dict[str, Any]:
        """Create the pod, idempotently: after a create with no answer the pod is looked up
        by name first, and a pod of that name that is this attempt's is adopted (a 409 on a
        create tried again: the first one was made)."""
        if creation.sent:
            found = await self._get(creation.name)
            if found is not None:
                return self._this_attempts(found, creation)
        creation.sent = True
        try:
            created = await self.api.create(creation.pod)
        except Conflict as exc:
            found = await self._get(creation.name)
            if found is None:
                raise SubmitError(f"pod {creation.name}: {exc}; it went meanwhile") from exc
            return self._this_attempts(found, creation)
        except KubeError:
            creation.sent = False  # answered: nothing was made
            raise
        if not self.kueue:
            self._seen(created)
        return created

    async def _get(self, name: str) -> dict[str, Any] | None:
        """The attempt's pod, or its Job where Kueue admits the pool's work."""
        return await (self.api.get_job(name) if self.kueue else self.api.get_pod(name))

    def _this_attempts(self, pod: dict[str, Any], creation: Creation) -> dict[str, Any]:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        mine = (creation.pod.get("metadata") or {}).get("labels") or {}
        keys = (kube_pod.LABEL_TASK, kube_pod.LABEL_ATTEMPT, kube_pod.LABEL_INSTALLATION)
        if any(labels.get(k) != mine.get(k) for k in keys):
            raise SubmitError(
                f"a pod named {creation.name} exists in namespace {self.namespace} and is not "
                "this task's: one namespace serves one Klique installation"
            )
        if not self.kueue:
            self._seen(pod)
        return pod

    def waits(self, creation: Creation, exc: KubeError) -> bool:
        """A refusal that is a wait: note why and when to try again (False: it stays)."""
        words = kube_states.create_wait(exc.code, exc.message)
        if words is None:
            return False
        creation.failures += 1
        delay = kube_states.retry_delay(
            creation.failures, exc.retry_after, RETRY_FIRST_S, RETRY_MOST_S
        )
        creation.next_at = time.monotonic() + delay
        creation.reason = f"waiting to create its pod: {words}; next try in {delay:.0f} s"
        log.info("pool %s: task %s %s", self.pool, creation.task_id, creation.reason)
        return True

    async def retry(self, held: set[int]) -> None:
        """Try again the creates that are due, of the tasks still held (by id) here."""
        for task_id, creation in list(self.pending.items()):
            if task_id not in held and not creation.in_submit:
                del self.pending[task_id]  # withdrawn, cancelled or requeued meanwhile
        now = time.monotonic()
        for creation in list(self.pending.values()):
            if creation.in_submit or creation.done or creation.next_at > now:
                continue
            try:
                await self.create(creation)
            except TransportError as exc:
                creation.reason = f"its pod's creation had no answer ({exc}); trying again"
                creation.next_at = now + RETRY_FIRST_S
            except KubeError as exc:
                if not self.waits(creation, exc):
                    creation.refused = f"refused by pool {self.pool}: {exc}"
            except SubmitError as exc:
                creation.refused = str(exc)

    def told(self, task: Task, creation: Creation) -> Observation | None:
        """A task whose pod is being made: waiting with the cluster's words, failed when
        refused for good, found once made (None: no news, or followed by its pod now)."""
        if creation.in_submit:
            return None
        if creation.refused or creation.done:
            del self.pending[task.id]
        if creation.refused:
            if task.state is TaskState.PLACED:
                return Observation(TaskState.QUEUED, creation.refused)
            return Observation(TaskState.FAILED, creation.refused)
        if task.state is TaskState.PLACED:  # outcome_unknown says why meanwhile
            if not creation.done:
                return None
            return Observation(TaskState.SUBMITTED, native_id=creation.name, job_dir=task.job_dir)
        return None if creation.done else Observation(TaskState.PENDING, creation.reason)
