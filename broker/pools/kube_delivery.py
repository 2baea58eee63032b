"""What a Kubernetes pool's pods are given: the server's runner zipapp in one immutable
ConfigMap (named by its digest, shared by the pool's pods), and each attempt's task.json in
a Secret of its own (docs/kubernetes.md).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from broker.errors import SubmitError
from broker.pools import kube_pod
from broker.pools.kube_api import Conflict, KubeApi

CONFIG_MAP_MAX = 1024 * 1024  # a ConfigMap's data, all keys together (etcd's object limit)


def runner_config_map(runner: bytes, labels: Mapping[str, str]) -> dict[str, Any]:
    """The ConfigMap holding the runner; refused when the runner does not fit one."""
    encoded = base64.b64encode(runner).decode()
    if len(encoded) > CONFIG_MAP_MAX:
        raise SubmitError(
            f"the runner ({len(runner)} bytes) does not fit a ConfigMap (1 MiB); fix: "
            "deliver it with an init container in the pool's pod template"
        )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"klique-runner-{hashlib.sha256(runner).hexdigest()[:16]}",
            "labels": dict(labels),
        },
        "binaryData": {kube_pod.RUNNER_FILE: encoded},
        "immutable": True,
    }


async def deliver_runner(api: KubeApi, runner: bytes, labels: Mapping[str, str]) -> str:
    """Make the runner's ConfigMap unless it is there (another server, or an earlier start,
    made it); its name."""
    manifest = runner_config_map(runner, labels)
    name = str(manifest["metadata"]["name"])
    if await api.get_config_map(name) is None:
        with contextlib.suppress(Conflict):
            await api.create(manifest)
    return name


def task_secret(request: kube_pod.PodRequest, document: Mapping[str, Any]) -> dict[str, Any]:
    """The Secret holding one attempt's task.json (its report token among it)."""
    data = base64.b64encode(json.dumps(document).encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": request.secret, "labels": kube_pod.labels(request)},
        "type": "Opaque",
        "data": {kube_pod.TASK_FILE: data},
    }
