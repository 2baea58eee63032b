"""The MCP tools of datasets: list the datasets you may read, show one (each version's files,
bytes, parent, maker and the tasks that read it). Each calls the REST API as the caller, like
every tool (broker/mcp/calls.py)."""

from __future__ import annotations

from urllib.parse import quote

from mcp.server.mcpserver import MCPServer

from broker.mcp.calls import Api, as_text


def register(server: MCPServer, api: Api) -> None:
    """Datasets' tools, bound to the API."""

    @server.tool()
    async def list_datasets() -> str:
        """The datasets you may read (your team's): each one's newest version, its files and
        bytes, and whose it is."""
        return as_text(await api.call("GET", "/datasets"))

    @server.tool()
    async def show_dataset(name: str) -> str:
        """A dataset's versions, oldest first: each one's parent, files, bytes, the bytes it
        added to its parent, who made it (and the run, where a run did), and the tasks that read
        it (`reads`, with the first ids in `read_by`). A version's id, NAME@N, is what
        klique.Dataset.get(dataset_id=) takes."""
        return as_text(await api.call("GET", f"/datasets/{quote(name, safe='')}"))
