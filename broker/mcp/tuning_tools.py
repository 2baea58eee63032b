"""The MCP tools of tuning: list your tunings, show one (its trials and best trial). Each calls
the REST API as the caller, like every tool (broker/mcp/calls.py)."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

from broker.mcp.calls import Api, as_text


def register(server: MCPServer, api: Api) -> None:
    """Tuning's tools, bound to the API."""

    @server.tool()
    async def list_tunings() -> str:
        """Your tunings (searches over a task's parameters), newest first: state, trials made,
        best value, GPU-hours used."""
        return as_text(await api.call("GET", "/tunings"))

    @server.tool()
    async def show_tuning(tuning_id: int) -> str:
        """One of your tunings: its settings, the best trial's parameters, value and model,
        and every trial (task, parameters, state, value, why it was pruned or failed)."""
        return as_text(await api.call("GET", f"/tunings/{int(tuning_id)}"))
