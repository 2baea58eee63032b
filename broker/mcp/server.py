"""`/mcp` on the Klique server: an MCP server (the official SDK, Streamable HTTP) whose tools are
the CLI's verbs. The caller's token is the bearer token; every tool calls Klique's own REST API
in-process with that token, so an agent meets the same compute resources, policies, ownership,
scopes and ledger as the CLI. A refusal (a lock, a quota, a policy, an unmapped account, a task
that is not yours, a read-only token) comes back as a tool result whose text is the API's
sentence. Before any call, broker/authz.py checks the token's scopes as the API does: a
submit-only token reads nothing through a tool, a read-only one changes nothing.

The OAuth protected-resource metadata (RFC 9728) is served at
`/.well-known/oauth-protected-resource/mcp`; a token is any the API takes as a bearer token:
Klique's own (`klique token create`) or the single sign-on provider's access token.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from fastapi import FastAPI
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import AnyHttpUrl

from broker import authz
from broker.api.auth import caller_of, identities_of
from broker.identity.resolve import Identities

_REFUSAL_WAIT_S = 5.0  # submit: how long to watch a new task for a pool's refusal
FINAL = {"completed", "failed", "cancelled", "timeout", "lost"}


class KliqueTokens:
    """The MCP SDK's token verifier: the API's own rules for a bearer token (the API checks
    the token's scopes again on every call a tool makes)."""

    def __init__(self, identities: Identities) -> None:
        self.identities = identities

    async def verify_token(self, token: str) -> AccessToken | None:
        # A single sign-on token may need the provider's keys: not on the event loop.
        found = await asyncio.to_thread(caller_of, self.identities, token)
        if found is None:
            return None
        return AccessToken(token=token, client_id=found.user, scopes=sorted(found.scopes))


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
            transport=transport, base_url="http://klique/api/v1", headers=headers
        ) as client:
            response = await client.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise ToolError(f"refused: {_detail(response)}")
        return response.json()

    def may(self, scope: str) -> bool:
        """Whether the calling token has `scope` (authz's rule)."""
        return authz.scopes_problem(self._token().scopes, scope) is None

    def _token(self) -> AccessToken:
        access = get_access_token()
        if access is None:
            raise ToolError("no Klique token came with this call; register the server with it")
        return access


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except ValueError:
        return f"HTTP {response.status_code}"
    if isinstance(detail, list):
        return "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail
        )
    return str(detail)


def _text(value: Any) -> str:
    return json.dumps(value, indent=2)


def build_mcp(app: FastAPI, public_url: str) -> MCPServer:
    server = MCPServer(
        name="klique",
        log_level="WARNING",
        instructions="Klique runs tasks and apps on GPU compute resources (Slurm, PBS, LSF, "
        "bare metal) as you, under your team's policies. Start with list_compute_resources.",
        token_verifier=KliqueTokens(identities_of(app)),
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(public_url),
            resource_server_url=AnyHttpUrl(f"{public_url}/mcp"),
            validate_token_resource=False,  # the verifier checks a token is for this server
        ),
    )
    register_tools(server, Api(app))
    return server


def register_tools(server: MCPServer, api: Api) -> None:
    from broker.mcp import tools

    tools.register(server, api)


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
