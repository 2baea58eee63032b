"""The MCP server at /mcp: Klique's tools for agents, each call made as the calling user."""
