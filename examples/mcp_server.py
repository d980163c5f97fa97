"""A small MCP server with a ``multiply`` tool, started over stdio by README's "Tools" example:
``MCPTools(command=[sys.executable, "examples/mcp_server.py"])``. Written with the official
``mcp`` SDK (2.x names its server class ``MCPServer``)."""

from mcp.server.mcpserver import MCPServer

server = MCPServer("calculator")


@server.tool()
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


if __name__ == "__main__":
    server.run()
