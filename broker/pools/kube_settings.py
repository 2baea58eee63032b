"""A Kubernetes pool's settings as the estate declares them (docs/kubernetes.md), and the
installation id that labels every pod a Klique installation makes."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from broker.pools.settings import PoolSettings
from broker.units import Seconds, SizeMB

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
LABEL_VALUE = r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"


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
