"""Tools a model calls between turns (docs: envs/tools.md)."""

from llm_gym.tools.base import Tool, ToolError, check_arguments
from llm_gym.tools.calls import TOOL_FORMATS, ToolCall, parse_tool_calls, tools_system_prompt
from llm_gym.tools.interpreter import Execution, PythonInterpreter
from llm_gym.tools.mcp_client import MCPTools
from llm_gym.tools.shell import Shell, ShellError, bash_tool
from llm_gym.tools.toolbox import MAX_OUTPUT_CHARS, Toolbox, ToolRecord, ToolSpec

__all__ = [
    "TOOL_FORMATS",
    "MAX_OUTPUT_CHARS",
    "Execution",
    "MCPTools",
    "PythonInterpreter",
    "Shell",
    "ShellError",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolRecord",
    "ToolSpec",
    "Toolbox",
    "bash_tool",
    "check_arguments",
    "parse_tool_calls",
    "tools_system_prompt",
]
