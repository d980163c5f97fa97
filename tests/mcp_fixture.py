"""A small MCP server written with the official SDK (2.x names its class MCPServer, 1.x
FastMCP), with an ``add`` tool, for the tests to start over stdio."""

import sys
import textwrap
from pathlib import Path

MCP_SERVER = textwrap.dedent(
    '''
    try:
        from mcp.server.mcpserver import MCPServer  # mcp 2.x
    except ImportError:
        from mcp.server.fastmcp import FastMCP as MCPServer  # mcp 1.x

    server = MCPServer("calculator")


    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b


    if __name__ == "__main__":
        server.run()
    '''
)


def mcp_server_command(folder: Path) -> list[str]:
    """Write the server into ``folder``; the command line that starts it."""
    path = Path(folder) / "server.py"
    path.write_text(MCP_SERVER)
    return [sys.executable, str(path)]
