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

from fastapi import FastAPI
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from pydantic import AnyHttpUrl

from broker.http.callers import caller_of, identities_of
from broker.identity.resolve import Identities
from broker.mcp import dataset_tools, model_tools, tools, tuning_tools
from broker.mcp.calls import Api


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
    tools.register(server, Api(app))
    model_tools.register(server, Api(app))
    tuning_tools.register(server, Api(app))
    dataset_tools.register(server, Api(app))
    return server
