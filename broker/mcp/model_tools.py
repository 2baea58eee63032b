"""The MCP tools of the model registry: list models, show one (versions, metrics, lineage),
promote a version. Each calls the REST API as the caller, like every tool (broker/mcp/calls.py)."""

from __future__ import annotations

from urllib.parse import quote

from mcp.server.mcpserver import MCPServer

from broker.mcp.calls import Api, as_text


def register(server: MCPServer, api: Api) -> None:
    """The registry's tools, bound to the API."""

    @server.tool()
    async def list_models() -> str:
        """The registry's models you may read (your team's): the newest version of each and the
        one in production."""
        return as_text(await api.call("GET", "/models"))

    @server.tool()
    async def show_model(name: str) -> str:
        """A model's versions (the run that made each, its files, metrics copied from the run,
        tags, stage) and the apps that serve it."""
        return as_text(await api.call("GET", f"/models/{quote(name, safe='')}"))

    @server.tool()
    async def promote_model(name: str, version: int, stage: str = "production") -> str:
        """Move a version of one of your team's models to a stage (none, staging, production,
        archived); to production, the version there before is archived. Endpoints launched with
        registry:NAME@production serve it from their next launch."""
        path = f"/models/{quote(name, safe='')}/versions/{int(version)}/stage"
        return as_text(await api.call("POST", path, json={"stage": stage}))
