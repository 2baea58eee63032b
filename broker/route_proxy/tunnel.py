"""The tunnel endpoint: `/api/v1/tasks/{id}/tunnel`, a WebSocket that a running app's runner
opens to the server with its task's report token. The route's requests ride it to the app."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, WebSocket
from fastapi import Path as PathParam

from broker.apps.launch import APPLICATION
from broker.http.callers import bearer, report_token_valid
from broker.http.paths import API
from broker.route_proxy.hub import Hub, Instance
from inside_job import frames

router = APIRouter()
log = logging.getLogger("klique.routes")
TaskId = Annotated[int, PathParam(ge=1, lt=2**63)]
POLICY_VIOLATION = 1008  # RFC 6455 7.4.1: refused; before the handshake the client sees 403
OLD_RUNNER = "the app's runner is older than the server (no flow control): launch the app again"


@router.websocket(f"{API}/tasks/{{task_id}}/tunnel")
async def tunnel(websocket: WebSocket, task_id: TaskId) -> None:
    """Only the current attempt of a running application, by its own report token."""
    control = websocket.app.state.control
    hub: Hub = websocket.app.state.route_hub
    token = bearer(websocket.headers.get("authorization"))
    if not report_token_valid(control.store, task_id, token):
        await websocket.close(POLICY_VIOLATION)
        return
    task = control.store.get(task_id)
    app = task.spec.app or {}
    if task.spec.kind != APPLICATION or task.state.final or not app.get("route"):
        await websocket.close(POLICY_VIOLATION)
        return
    await websocket.accept()
    instance = Instance(
        task.id, str(app["route"]), str(app.get("path") or "strip"), websocket.send_bytes
    )
    hub.register(instance)
    log.info("task %s: its tunnel serves route %s", task.id, instance.route)
    try:
        await _read(websocket, hub, instance)
    finally:
        hub.unregister(instance)


async def _read(websocket: WebSocket, hub: Hub, instance: Instance) -> None:
    """The runner's frames, one at a time: this reader never waits on a stream's consumer (each
    stream holds at most its window), so one slow caller cannot stall the tunnel's others."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        data = message.get("bytes")
        if not data:
            continue
        try:
            stream, kind, payload = frames.decode(data)
        except ValueError:
            continue
        if stream == 0:
            if kind == frames.READY:
                if frames.ready_version(payload) < frames.VERSION:
                    await websocket.close(POLICY_VIOLATION, OLD_RUNNER)
                    return
                hub.mark_ready(instance)
            continue
        problem = instance.deliver(stream, kind, payload)
        if problem is not None:
            log.warning("task %s: stream %s closed: %s", instance.task_id, stream, problem)
            close = frames.encode_json(stream, frames.CLOSE, {"code": 1008, "reason": problem})
            try:
                await instance.send(close)
            except (OSError, RuntimeError):  # the tunnel is gone already
                return
