"""Klique's REST API as an MCP tool calls it: in-process, as the user whose token called the
tool, refused first where the token's scopes do not cover the call; and the API's answers as a
tool's text."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from fastapi import FastAPI
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver.exceptions import ToolError

from broker import authz
from broker.http.paths import API

_REFUSAL_WAIT_S = 5.0  # submit: how long to watch a new task for a pool's refusal


class Api:
    """Klique's REST API, in-process, as the user whose token called the tool."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The API's answer; refused first, as authz decides, when the token's scopes do not
        cover the request (the API asks authz again)."""
        access = self._token()
        problem = authz.scopes_problem(access.scopes, authz.needed_scope(method))
        if problem:
            raise ToolError(f"refused: {problem}")
        transport = httpx.ASGITransport(app=self.app)
        headers = {"Authorization": f"Bearer {access.token}"}
        async with httpx.AsyncClient(
            transport=transport, base_url=f"http://klique{API}", headers=headers
        ) as client:
            response = await client.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise ToolError(f"refused: {detail_of(response)}")
        return response.json()

    def may(self, scope: str) -> bool:
        """Whether the calling token has `scope` (authz's rule)."""
        return authz.scopes_problem(self._token().scopes, scope) is None

    def _token(self) -> AccessToken:
        access = get_access_token()
        if access is None:
            raise ToolError("no Klique token came with this call; register the server with it")
        return access


def detail_of(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except ValueError:
        return f"HTTP {response.status_code}"
    if isinstance(detail, list):
        return "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail
        )
    return str(detail)


def as_text(value: Any) -> str:
    return json.dumps(value, indent=2)


async def wait_for_refusal(api: Api, task: dict[str, Any]) -> dict[str, Any]:
    """A new task, watched briefly: a pool's refusal (an unmapped account) shows at once. A
    token that may submit but not read gets the task as made, unwatched."""
    if not api.may("read"):
        return task
    deadline = asyncio.get_running_loop().time() + _REFUSAL_WAIT_S
    while task["state"] in ("queued", "placed") and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.25)
        task = await api.call("GET", f"/tasks/{task['id']}")
    if task["state"] == "failed" and task["reason"].startswith("refused"):
        raise ToolError(f"task {task['id']} {task['reason']}")
    return task
