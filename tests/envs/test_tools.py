"""llm_gym.tools: the sandboxed interpreter's claims, call parsing, function and MCP tools."""

import os
import pickle

import pytest
from mcp_fixture import mcp_server_command

from llm_gym.tools import (
    MCPTools,
    PythonInterpreter,
    Tool,
    Toolbox,
    ToolCall,
    check_arguments,
    parse_tool_calls,
)

# Each sandbox claim README makes, as (code, what the output must say). The interpreter must
# end each one with a readable message, and the next call must work.
SANDBOX_CASES = {
    "infinite loop": ("while True:\n    pass", "ran past the 2 s limit and was killed"),
    "fork bomb": ("import os\nwhile True:\n    os.fork()", "BlockingIOError"),
    "10 GiB allocation": ("x = bytearray(10 * 2**30)", "MemoryError"),
    "filling the scratch directory": (
        "for i in range(20):\n    open(f'part{i}', 'wb').write(b'0' * (8 << 20))",
        "No space left on device",
    ),
    "socket": (
        "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=3)",
        "Network is unreachable",
    ),
}


@pytest.fixture(scope="module")
def interpreter():
    return PythonInterpreter(timeout=2)


def test_the_sandbox_runs_code_and_returns_its_output(interpreter):
    result = interpreter.run("print(48 / 2 + 48)")
    assert (result.ok, result.output, result.exit_code, result.timed_out) == (
        True,
        "72.0\n",
        0,
        False,
    )
    assert interpreter.isolation == "bubblewrap"  # these machines run bwrap unprivileged


@pytest.mark.parametrize("case", sorted(SANDBOX_CASES))
def test_each_sandbox_limit_ends_with_a_readable_message(interpreter, case):
    code, message = SANDBOX_CASES[case]
    result = interpreter.run(code)
    assert not result.ok
    assert message in result.output
    # Only the infinite loop meets the wall-clock kill; the others end by their own limit.
    assert result.timed_out == (case == "infinite loop")
    assert interpreter.run("print('next')").output == "next\n"


def test_the_sandbox_writes_only_its_scratch_directory(interpreter, tmp_path):
    target = tmp_path / "outside.txt"
    result = interpreter.run(f"open({str(target)!r}, 'w').write('x')")
    # read-only where it is bound, and not ours where root's folders lead to it (the code
    # runs as nobody when the sandbox is started as root)
    assert not result.ok
    assert "Read-only file system" in result.output or "Permission denied" in result.output
    assert not target.exists()
    inside = interpreter.run("open('here.txt', 'w').write('hi'); print(open('here.txt').read())")
    assert inside.output == "hi\n"
    # Each call starts in a fresh scratch directory: the file is gone.
    again = interpreter.run("import os; print(os.listdir('.'))")
    assert again.output == "[]\n"


def test_the_sandbox_hides_the_parents_environment_and_home(interpreter, monkeypatch):
    monkeypatch.setenv("LLM_GYM_TEST_SECRET", "hunter2")
    result = interpreter.run("import os; print(sorted(os.environ)); print(os.listdir('/root'))")
    assert "hunter2" not in result.output and "LLM_GYM_TEST_SECRET" not in result.output
    environ = result.output.splitlines()[0]
    assert environ == str(sorted(["HOME", "LC_CTYPE", "PATH", "PWD", "TMPDIR"])) or environ == str(
        sorted(["HOME", "PATH", "PWD", "TMPDIR"])
    )
    home_listing = result.output.splitlines()[1]
    assert ".bashrc" not in home_listing and ".ssh" not in home_listing


def test_the_sandbox_truncates_output_and_bounds_files():
    interpreter = PythonInterpreter(timeout=5, max_output_chars=50, max_file_mb=1)
    result = interpreter.run("while True:\n    print('x' * 1000)")
    assert result.truncated and not result.ok
    assert result.output.startswith("x" * 25) and "characters cut" in result.output
    big = interpreter.run("open('f', 'wb').write(b'0' * (2 << 20))")
    assert not big.ok and "File too large" in big.output


def test_the_rlimits_fallback_still_bounds_time_memory_and_processes():
    with pytest.warns(RuntimeWarning, match="WITHOUT bubblewrap"):
        interpreter = PythonInterpreter(timeout=2, sandbox="rlimits")
        assert interpreter.isolation == "rlimits"
        assert "MemoryError" in interpreter.run("x = bytearray(10 * 2**30)").output
    assert "BlockingIOError" in interpreter.run("import os\nwhile True:\n    os.fork()").output
    assert interpreter.run("while True: pass").timed_out
    assert interpreter.run("import os; print(os.environ.get('HOME') != os.path.expanduser('~'))")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout": 0}, "timeout must be a finite number > 0, got 0"),
        ({"memory_mb": "1G"}, "memory_mb must be an int >= 1, got '1G'"),
        (
            {"sandbox": "docker"},
            r"sandbox must be one of \('auto', 'bubblewrap', 'rlimits'\), got 'docker'",
        ),
    ],
)
def test_interpreter_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PythonInterpreter(**kwargs)


# -- call formats -------------------------------------------------------------------------


def test_hermes_calls_are_read_in_order_with_errors_kept_as_calls():
    text = (
        'Let me compute. <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 3}"}</tool_call>'
        "<tool_call>not json</tool_call><tool_call>[1]</tool_call>"
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call><tool_call>{"name": "open"'
    )
    calls = parse_tool_calls(text)
    assert [c.name for c in calls] == ["add", "add", None, None, "f", None]
    assert calls[0].arguments == {"a": 1, "b": 2} and calls[1].arguments == {"a": 3}
    assert "not valid JSON" in calls[2].error
    assert 'needs a "name"' in calls[3].error
    assert '"arguments" must be a JSON object, got list' in calls[4].error
    assert "not closed" in calls[5].error
    assert parse_tool_calls("The answer is 3.") == []


def test_markdown_calls_are_python_blocks():
    text = "First:\n```python\nprint(1)\n```\nthen\n```py\nprint(2)\n```"
    assert parse_tool_calls(text, "markdown") == [
        ToolCall("python", {"code": "print(1)\n"}),
        ToolCall("python", {"code": "print(2)\n"}),
    ]
    with pytest.raises(ValueError, match="tool_format must be one of"):
        parse_tool_calls(text, "xml")


def test_check_arguments_names_what_is_wrong():
    params = Tool.from_function(_scale).parameters
    assert check_arguments(params, {"x": 2.5, "factor": 3}) is None
    assert "missing required arguments ['x']" in check_arguments(params, {})
    assert "unknown arguments ['y']" in check_arguments(params, {"x": 1, "y": 2})
    assert "argument 'factor' must be integer, got float" in check_arguments(
        params, {"x": 1, "factor": 1.5}
    )
    assert "must be number, got bool" in check_arguments(params, {"x": True})
    assert "arguments must be a JSON object, got list" in check_arguments(params, [1])


def _scale(x: float, factor: int = 2) -> float:
    """Multiply a number.

    Args:
        x: The number.
        factor: How many times.
    """
    return x * factor


def _fails(x: int) -> int:
    """Always raises.

    Args:
        x: Anything.
    """
    raise ZeroDivisionError("no luck")


def test_toolbox_turns_every_failure_into_a_readable_record():
    box = Toolbox([_scale, _fails])
    assert box.run(ToolCall("_scale", {"x": 2.0})).output == "4.0"
    records = [
        box.run(ToolCall("_fails", {"x": 1})),
        box.run(ToolCall("nope", {})),
        box.run(ToolCall("_scale", {"x": "two"})),
        box.run(ToolCall(None, error="the call is not valid JSON")),
    ]
    assert [r.ok for r in records] == [False] * 4
    assert records[0].output == "Error: _fails raised ZeroDivisionError: no luck"
    assert records[1].output == "Error: unknown tool 'nope'; the tools are ['_fails', '_scale']"
    assert records[2].output == "Error: _scale: argument 'x' must be number, got str 'two'"
    assert records[3].output == "Error: the call is not valid JSON"


@pytest.mark.parametrize(
    ("tools", "kwargs", "error", "message"),
    [
        ("python", {}, TypeError, "tools must be a list"),
        (["ruby"], {}, ValueError, r"tools\[0\]: the built-in tools are \['python'\]"),
        ([3], {}, TypeError, r"tools\[0\] must be 'python', a function"),
        ([_scale, _scale], {}, ValueError, r"tools\[1\]: a second tool named '_scale'"),
        ([lambda x: x], {}, ValueError, r"tools\[0\]: tool '<lambda>' needs type hints"),
        ([_scale], {"tool_format": "markdown"}, ValueError, "add 'python' to tools"),
        (["python"], {"tool_format": "json"}, ValueError, "tool_format must be one of"),
    ],
)
def test_toolbox_rejects_bad_tools(tools, kwargs, error, message):
    with pytest.raises(error, match=message):
        Toolbox(tools, **kwargs)


# -- MCP ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory):
    return mcp_server_command(tmp_path_factory.mktemp("mcp"))


def test_mcp_tools_list_call_and_shut_down(mcp_server):
    server = MCPTools(command=mcp_server)
    try:
        (add,) = server.tools
        assert add.name == "add" and add.description == "Add two integers."
        assert add.parameters["required"] == ["a", "b"]
        assert server.call("add", a=2, b=40) == "42"
        box = Toolbox([server])
        assert box.run(ToolCall("add", {"a": 1, "b": 2})).output == "3"
        bad = box.run(ToolCall("add", {"a": 1, "b": "x"}))
        assert not bad.ok and "argument 'b' must be integer" in bad.output
        copy = pickle.loads(pickle.dumps(server))  # AsyncVectorEnv's workers start their own
        try:
            assert copy.call("add", a=1, b=1) == "2"
        finally:
            copy.close()
    finally:
        server.close()
    assert not server.running
    assert "not running" in Toolbox([server]).run(ToolCall("add", {"a": 1, "b": 2})).output


def test_mcp_tools_reject_a_bad_command():
    with pytest.raises(TypeError, match="command must be a non-empty list of strings"):
        MCPTools(command="python server.py")
    with pytest.raises(RuntimeError, match="did not start"):
        MCPTools(command=[os.path.join(os.sep, "no", "such", "server")], timeout=10)
