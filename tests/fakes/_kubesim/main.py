"""A Kubernetes API server for one node, whose kubelet runs each pod's containers in Podman.

Usage: kube-emulator --port N --state DIR [--cpu 8] [--memory 16Gi] [--resource NAME=N]...
                     [--namespace NAME[:label=value[,label=value]]]... [--history 1000]
                     [--not-ready-toleration-s 300] [--image-backoff-scale 1] [--podman podman]
                     [--kueue-quota RESOURCE=N]... (Kueue's model: kueue.py)

The API (the subset Klique uses), after kubernetes.io/docs/reference/using-api/api-concepts/:
- /api/v1/namespaces: POST creates a namespace (its labels set its Pod Security level), GET lists.
- /api/v1/namespaces/{ns}/{pods,secrets,configmaps,resourcequotas,events} and, for kinds other
  modules register in store.KINDS, /apis/{group}/{version}/namespaces/{ns}/{plural}: POST creates
  (201; 409 AlreadyExists; admission.py: 422 Invalid, 404 for an unknown namespace, 403 from Pod
  Security or a ResourceQuota), GET lists (labelSelector with =, ==, != and bare keys; the
  list's metadata.resourceVersion); ?watch=1 streams JSON lines {"type": ADDED|MODIFIED|DELETED|
  ERROR, "object": ...} after the given resourceVersion (none: the current objects as ADDED
  first), ending after timeoutSeconds; a resourceVersion older than the kept history gets one
  ERROR event holding a Status with code 410 (reason Expired), as after etcd's compaction.
- .../{plural}/{name}: GET (404 NotFound), PATCH (a JSON merge patch), DELETE
  (gracePeriodSeconds in the query or a DeleteOptions body; a bound pod gets a
  deletionTimestamp, its containers are stopped within the grace, then it leaves: DELETED; grace
  0 removes it at once). A pod that leaves takes the objects whose ownerReferences name it along
  (the garbage collector's background deletion).
- .../pods/{name}/log?container=NAME[&tailLines=N][&limitBytes=N]: the container's output; 400
  "a container name must be specified for pod X, choose one of: [a b]" without `container` on a
  pod of several containers; 400 "... is waiting to start: REASON" before it started.
- .../pods/{name}/eviction (POST, policy/v1 Eviction): the Eviction API: condition
  DisruptionTarget (reason EvictionByEvictionAPI), then a graceful delete; 201 Status Success.
- Every write bumps one global resourceVersion (a counter, as etcd's revision) and a create sets
  uid and creationTimestamp. Errors are Status objects.

Not Kubernetes, under /emulator/ (the tests' levers):
- POST /emulator/faults {"create": [{"status": 429|500|503, "times": N, "kind": "pods"}],
  "drop_after_create": N}: the next creates of that plural (pods unless "kind" says) answer
  that status, entries in order (429 and 503 with Retry-After: 1); then the next N pod creates
  are committed and their connection closed with no answer (a network cut after the POST).
  A POST replaces the faults left; GET /emulator/faults shows them.
- POST /emulator/nodes/emulated-node {"ready": false|true}: NotReady is a lost node: its
  containers die, its pods get Ready=False (NodeNotReady) and no more status from the kubelet;
  after --not-ready-toleration-s (Kubernetes' default toleration of node.kubernetes.io/
  unreachable: 300 s) each gets DisruptionTarget (reason DeletionByTaintManager) and a
  deletionTimestamp, and stays Terminating while the node is down. Ready again: the kubelet's
  statuses arrive and Terminating pods leave.
- POST /emulator/preempt/{ns}/{name}: DisruptionTarget (reason PreemptionByScheduler), then a
  graceful delete, as the scheduler preempts a victim.
- POST /emulator/compact advances the resourceVersion, drops the event history and ends every
  open watch (watchers resuming from their last resourceVersion get 410 Gone).
- GET /emulator/requests counts the lists and watches served, by label selector.

The node (`emulated-node`; pod_run.py's docstring has a pod's life): --cpu, --memory and each
--resource are what it can hold; images are those in podman's local store (no registry is
reached; any other image is ErrImagePull then ImagePullBackOff, its back-off times
--image-backoff-scale). Containers run with `podman run` (podman.py), on the host's network.
Namespaces: `default` and each --namespace exist from the start.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from pathlib import Path

import uvicorn

from .api import make_app
from .cluster import Cluster
from .kubelet import Node
from .kueue import from_args
from .store import CLUSTER, Store, parse_quantity


def namespace_arg(text: str) -> tuple[str, dict[str, str]]:
    """NAME[:label=value[,label=value]]."""
    name, _, rest = text.partition(":")
    labels = dict(pair.split("=", 1) for pair in rest.split(",") if pair)
    return name, labels


def parser() -> argparse.ArgumentParser:
    found = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    found.add_argument("--port", type=int, required=True)
    found.add_argument("--state", type=Path, required=True)
    found.add_argument("--cpu", default="8")
    found.add_argument("--memory", default="16Gi")
    found.add_argument("--resource", action="append", default=[])
    found.add_argument("--namespace", action="append", default=[], type=namespace_arg)
    found.add_argument("--history", type=int, default=1000)
    found.add_argument("--not-ready-toleration-s", type=float, default=300.0)
    found.add_argument("--image-backoff-scale", type=float, default=1.0)
    found.add_argument("--podman", default="podman")
    found.add_argument("--kueue-quota", action="append", default=[])  # kueue.py: RESOURCE=N
    return found


def build(args: argparse.Namespace) -> Cluster:
    allocatable = {"cpu": parse_quantity(args.cpu), "memory": parse_quantity(args.memory)}
    for item in args.resource:
        key, _, count = item.partition("=")
        allocatable[key] = float(count)
    args.state.mkdir(parents=True, exist_ok=True)
    store = Store(args.history)
    node = Node(store, args.state, allocatable, args.podman, args.image_backoff_scale)
    cluster = Cluster(store, node, args.not_ready_toleration_s)
    for name, labels in [("default", {}), *args.namespace]:
        obj = cluster.namespace(name, labels)
        store.objects[(CLUSTER, "namespaces", name)] = obj
        obj["metadata"]["resourceVersion"] = "1"
    return cluster


def main(argv: list[str] | None = None, extensions: Sequence[object] = ()) -> int:
    args = parser().parse_args(argv)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    cluster = build(args)  # its asyncio objects belong to the loop uvicorn runs
    kueue = from_args(args.kueue_quota)  # Kueue's model, where a quota is given
    app = make_app(cluster, [*extensions, *([kueue] if kueue else [])])
    # Open watches must not hold up the shutdown that removes the node's containers.
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=3,
    )
    loop.run_until_complete(uvicorn.Server(config).serve())
    return 0
