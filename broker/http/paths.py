"""Where the REST API lives on the server, and the path parameters every adapter reads the same
way (a task's id in `/api/v1/tasks/{task_id}` and in the web UI's `/tasks/{task_id}`), and
how a route that sends or takes a file's bytes describes them."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

API = "/api/v1"
TaskId = Annotated[int, Path(ge=1, lt=2**63, description="A task's id.")]
# The OpenAPI body of a route that streams a file's bytes, in or out (artifacts, dataset blobs,
# model files), where FastAPI would otherwise say JSON.
BINARY = {
    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
}
