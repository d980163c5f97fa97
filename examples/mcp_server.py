"""A small MCP server with a ``multiply`` tool, started over stdio by the example of
docs/envs/tools.md: ``MCPTools(command=[sys.executable, "examples/mcp_server.py"])``. Written
with the official ``mcp`` SDK (2.x names its server class ``MCPServer``, 1.x ``FastMCP``)."""

try:
    from mcp.server.mcpserver import MCPServer  # mcp 2.x
except ImportError:
    from mcp.server.fastmcp import FastMCP as MCPServer  # mcp 1.x

server = MCPServer("calculator")


@server.tool()
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


if __name__ == "__main__":
    server.run()
