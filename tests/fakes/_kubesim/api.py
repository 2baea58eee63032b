"""The HTTP face of the emulator: the Kubernetes API's routes (main.py lists them) and the
/emulator/ routes that inject faults."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from . import admission
from .cluster import Cluster
from .faults import ANSWERS, Faults
from .kubelet import NODE
from .store import CLUSTER, KINDS, selector_matches, status_body, status_error

CUT = "kubesim.cut"  # the scope key of the function that closes the request's connection


def with_connection_cut(app: Any) -> Any:
    """The ASGI app, given a way to close a request's connection without an answer (the
    drop_after_create fault): uvicorn's `send` is a method of its request cycle, which holds
    the connection's transport."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        cycle = getattr(send, "__self__", None)
        transport = getattr(cycle, "transport", None)
        if transport is not None:
            scope[CUT] = transport.close
        await app(scope, receive, send)

    return wrapped


def answer(code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=code, headers=headers)


def listing(cluster: Cluster, ns: str, plural: str, selector: str) -> dict[str, Any]:
    kind = KINDS[plural]
    items = [
        decorate(cluster, plural, obj)
        for obj in cluster.store.items(ns, plural)
        if selector_matches(selector, obj["metadata"].get("labels") or {})
    ]
    return {
        "kind": f"{kind.kind}List", "apiVersion": kind.api_version,
        "metadata": {"resourceVersion": str(cluster.store.revision)}, "items": items,
    }  # fmt: skip


def decorate(cluster: Cluster, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
    """What controllers keep up to date on read: a ResourceQuota's status."""
    if plural == "resourcequotas":
        return {**obj, "status": admission.quota_status(cluster.store, obj)}
    return obj


def make_app(cluster: Cluster, extensions: Sequence[Any] = ()) -> Any:
    store = cluster.store

    async def collection(request: Request) -> Response:
        ns, plural = (
            request.path_params.get("ns", CLUSTER),
            request.path_params.get("plural", "namespaces"),
        )
        if plural not in KINDS:
            return status_error(
                404, "NotFound", f"the server could not find the requested resource ({plural})"
            )
        if request.method == "POST":
            return await create(request, ns, plural)
        selector = request.query_params.get("labelSelector", "")
        if request.query_params.get("watch") in ("1", "true"):
            store.count("watch", selector)
            return watch(request, ns, plural, selector)
        store.count("list", selector)
        return JSONResponse(listing(cluster, ns, plural, selector))

    async def create(request: Request, ns: str, plural: str) -> Response:
        try:
            obj = await request.json()
        except ValueError:
            return status_error(
                400, "BadRequest", "the body of the request was in an unknown format"
            )
        status = cluster.faults.error_for(plural)
        if status is not None:
            reason, message = ANSWERS[status]
            headers = {"Retry-After": "1"} if status in (429, 503) else None
            return answer(status, status_body(status, reason, message), headers)
        strict = request.query_params.get("fieldValidation") == "Strict"
        if plural == "namespaces" and isinstance(obj, dict):
            meta = obj.get("metadata") or {}
            obj = {**obj, **cluster.namespace(meta.get("name", ""), meta.get("labels") or {})}
        code, body = await cluster.create(ns, plural, obj, strict)
        if code == 201 and cluster.faults.drop_for(plural) and CUT in request.scope:
            request.scope[CUT]()  # committed; the client never hears so
            await asyncio.sleep(0.05)
        return answer(code, body)

    def watch(request: Request, ns: str, plural: str, selector: str) -> Response:
        since = request.query_params.get("resourceVersion")
        timeout = float(request.query_params.get("timeoutSeconds") or 1800)

        def line(kind: str, obj: dict[str, Any]) -> bytes:
            return (json.dumps({"type": kind, "object": obj}) + "\n").encode()

        async def events() -> AsyncIterator[bytes]:
            generation = store.generation
            ends = time.monotonic() + timeout
            if since and since != "0" and int(since) + 1 < store.oldest:
                gone = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": f"too old resource version: {since} ({store.oldest - 1})",
                        "reason": "Expired", "code": 410}  # fmt: skip
                yield line("ERROR", gone)
                return
            if not since or since == "0":
                for obj in store.items(ns, plural):
                    if selector_matches(selector, obj["metadata"].get("labels") or {}):
                        yield line("ADDED", obj)
                after = store.revision
            else:
                after = int(since)
            while time.monotonic() < ends and generation == store.generation:
                for revision, n, p, kind, obj in list(store.history):
                    if revision > after and n == ns and p == plural:
                        after = revision
                        if selector_matches(selector, obj["metadata"].get("labels") or {}):
                            yield line(kind, obj)
                async with store.changed:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(
                            store.changed.wait(), min(1.0, max(ends - time.monotonic(), 0.01))
                        )

        return StreamingResponse(events(), media_type="application/json")

    async def item(request: Request) -> Response:
        ns = request.path_params.get("ns", CLUSTER)
        plural = request.path_params.get("plural", "namespaces")
        name = request.path_params["name"]
        obj = store.get(ns, plural, name) if plural in KINDS else None
        if obj is None:
            return status_error(404, "NotFound", f'{plural} "{name}" not found')
        if request.method == "GET":
            return JSONResponse(decorate(cluster, plural, obj))
        body = await request.body()
        if request.method == "PATCH":
            try:
                patch = json.loads(body)
            except ValueError:
                return status_error(400, "BadRequest", "the patch is not JSON")
            return answer(*await cluster.patch(ns, plural, name, patch))
        grace: Any = request.query_params.get("gracePeriodSeconds")
        if grace is None and body:
            with contextlib.suppress(ValueError, AttributeError):
                grace = json.loads(body).get("gracePeriodSeconds")
        return answer(
            *await cluster.delete(ns, plural, name, None if grace is None else float(grace))
        )

    async def pod_log(request: Request) -> Response:
        ns, name = request.path_params["ns"], request.path_params["name"]
        pod = store.get(ns, "pods", name)
        if pod is None:
            return status_error(404, "NotFound", f'pods "{name}" not found')
        chosen = log_container(pod, request.query_params.get("container"))
        if isinstance(chosen, Response):
            return chosen
        path = cluster.node.log_path(pod, chosen)
        if not path.exists():
            reason = container_waiting(pod, chosen)
            return status_error(
                400,
                "BadRequest",
                f'container "{chosen}" in pod "{name}" is waiting to start: {reason}',
            )
        data = path.read_bytes()
        tail = request.query_params.get("tailLines")
        if tail is not None:
            data = b"".join(data.splitlines(keepends=True)[-int(tail) :]) if int(tail) else b""
        limit = request.query_params.get("limitBytes")
        if limit is not None:
            data = data[: int(limit)]
        return PlainTextResponse(data.decode(errors="replace"))

    async def eviction(request: Request) -> Response:
        body: dict[str, Any] = {}
        with contextlib.suppress(ValueError):
            body = await request.json()
        grace = ((body or {}).get("deleteOptions") or {}).get("gracePeriodSeconds")
        ns, name = request.path_params["ns"], request.path_params["name"]
        return answer(*await cluster.evict(ns, name, grace))

    async def faults(request: Request) -> Response:
        if request.method == "POST":
            try:
                cluster.faults = Faults.parse(await request.json())
            except (ValueError, TypeError, AttributeError) as exc:
                return status_error(400, "BadRequest", f"/emulator/faults: {exc}")
        return JSONResponse(cluster.faults.left())

    async def node(request: Request) -> Response:
        if request.path_params["name"] != NODE:
            return status_error(404, "NotFound", f'nodes "{request.path_params["name"]}" not found')
        body = await request.json()
        await cluster.set_node_ready(bool(body.get("ready", True)))
        return JSONResponse({"name": NODE, "ready": cluster.node.ready.is_set()})

    async def preempt(request: Request) -> Response:
        ns, name = request.path_params["ns"], request.path_params["name"]
        message = "default-scheduler: preempting to accommodate a higher priority pod"
        return answer(*await cluster.disrupt(ns, name, "PreemptionByScheduler", message))

    async def compact(request: Request) -> Response:
        await store.compact()
        return JSONResponse({"oldest": store.oldest})

    async def requests(request: Request) -> Response:
        return JSONResponse(store.requests)

    base = "/api/v1/namespaces/{ns}"
    group = "/apis/{group}/{version}/namespaces/{ns}"
    routes = [
        Route("/api/v1/namespaces", collection, methods=["GET", "POST"]),
        Route("/api/v1/namespaces/{name}", item, methods=["GET"]),
        Route(base + "/pods/{name}/log", pod_log, methods=["GET"]),
        Route(base + "/pods/{name}/eviction", eviction, methods=["POST"]),
        Route(base + "/{plural}", collection, methods=["GET", "POST"]),
        Route(base + "/{plural}/{name}", item, methods=["GET", "DELETE", "PATCH"]),
        Route(group + "/{plural}", collection, methods=["GET", "POST"]),
        Route(group + "/{plural}/{name}", item, methods=["GET", "DELETE", "PATCH"]),
        Route("/emulator/faults", faults, methods=["GET", "POST"]),
        Route("/emulator/nodes/{name}", node, methods=["POST"]),
        Route("/emulator/preempt/{ns}/{name}", preempt, methods=["POST"]),
        Route("/emulator/compact", compact, methods=["POST"]),
        Route("/emulator/requests", requests, methods=["GET"]),
    ]
    for extension in extensions:
        routes = [*getattr(extension, "routes", list)(), *routes]
    steps = [e.step for e in extensions if hasattr(e, "step")]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop().create_task(stepping(cluster, steps)) if steps else None
        yield
        if loop is not None:
            loop.cancel()
        await cluster.node.remove_all()

    return with_connection_cut(Starlette(routes=routes, lifespan=lifespan))


async def stepping(cluster: Cluster, steps: list[Callable[[Cluster], Awaitable[None]]]) -> None:
    """The controllers of extensions (Kueue's), every 0.2 s."""
    while True:
        for step in steps:
            await step(cluster)
        await asyncio.sleep(0.2)


def log_container(pod: dict[str, Any], asked: str | None) -> str | Response:
    """The container whose log is asked for; the API's 400s when it is ambiguous or unknown."""
    name = pod["metadata"]["name"]
    containers = [c["name"] for c in pod["spec"].get("containers", [])]
    inits = [c["name"] for c in pod["spec"].get("initContainers", [])]
    if asked is None:
        if len(containers) == 1:
            return containers[0]
        message = (
            f"a container name must be specified for pod {name}, "
            f"choose one of: [{' '.join(containers)}]"
        )
        if inits:
            message += f" or one of the init containers: [{' '.join(inits)}]"
        return status_error(400, "BadRequest", message)
    if asked not in containers + inits:
        return status_error(400, "BadRequest", f"container {asked} is not valid for pod {name}")
    return asked


def container_waiting(pod: dict[str, Any], container: str) -> str:
    status = pod.get("status") or {}
    for entry in [*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])]:
        if entry["name"] == container:
            return str((entry["state"].get("waiting") or {}).get("reason", "ContainerCreating"))
    return "ContainerCreating"
