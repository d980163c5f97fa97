"""Code graded by its unit tests: HumanEval's ``check(candidate)`` split into its top-level
asserts, each counted on its own.

Model output is hostile input, so the program under test decides nothing. It runs in a
fresh sandboxed interpreter (``PythonInterpreter``: time, memory, processes, file size, no
network, no host files under bubblewrap) and only answers calls: each call's arguments go in
and its return value comes out as plain data (None, bool, int, float, complex, str, bytes,
and lists, tuples, sets and dicts of them), rebuilt with exact types in the grader's
process. There the test's own code (the dataset's, trusted) runs the asserts, EvalPlus-style.
An object whose ``__eq__`` always says True, patched builtins, a printed verdict or an early
exit change nothing outside the program; the test and its expected values never enter the
sandbox; the host never ``exec``s the program.
"""

from __future__ import annotations

import ast
import builtins
import functools
import json
import random
import re
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llm_gym.rewards._parsing import parse
from llm_gym.tools.interpreter import Channel, PythonInterpreter

__all__ = ["CODE_FORMATS", "CodeScore", "extract_code", "grade", "split_check"]

CODE_FORMATS = ("code_block", "function")  # a fenced ```python block, or the bare function
_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)
MAX_CODE_CHARS = 20_000  # a longer "function" is no answer; refusing it bounds the work

# Plain data as JSON, tagged with exact types; run both here and in the sandbox (after the
# program, so it may be tampered with there: the grader decodes what comes out strictly).
_CODEC = """
def _llm_gym_encode(value, depth=0):
    if depth > 100:
        raise ValueError("data nested more than 100 deep")
    kind = type(value)
    if value is None:
        return ["None"]
    if kind is bool or kind is str:
        return [kind.__name__, value]
    if kind is int:
        return ["int", hex(value)]  # hex: no str-to-int digit limit, linear time
    if kind is float:
        return ["float", value.hex()]  # exact, inf and nan included
    if kind is complex:
        return ["complex", value.real.hex(), value.imag.hex()]
    if kind is bytes:
        return ["bytes", value.hex()]
    if kind in (list, tuple, set, frozenset):
        return [kind.__name__, [_llm_gym_encode(item, depth + 1) for item in value]]
    if kind is dict:
        pairs = [[_llm_gym_encode(k, depth + 1), _llm_gym_encode(v, depth + 1)]
                 for k, v in value.items()]
        return ["dict", pairs]
    if kind.__module__ == "numpy" and callable(getattr(value, "item", None)):
        return _llm_gym_encode(value.item(), depth + 1)  # a numpy scalar: its Python value
    raise TypeError(f"a {kind.__name__} is not plain data")


def _llm_gym_decode(node, depth=0):
    if depth > 100 or type(node) is not list or not node or type(node[0]) is not str:
        raise ValueError(f"not an encoded value: {str(node)[:80]}")
    tag, args = node[0], node[1:]
    kinds = [type(arg) for arg in args]
    if tag == "None" and not args:
        return None
    if tag == "bool" and kinds == [bool]:
        return args[0]
    if tag == "str" and kinds == [str]:
        return args[0]
    if tag == "int" and kinds == [str]:
        return int(args[0], 16)
    if tag == "float" and kinds == [str]:
        return float.fromhex(args[0])
    if tag == "complex" and kinds == [str, str]:
        return complex(float.fromhex(args[0]), float.fromhex(args[1]))
    if tag == "bytes" and kinds == [str]:
        return bytes.fromhex(args[0])
    containers = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}
    if tag in containers and kinds == [list]:
        return containers[tag](_llm_gym_decode(item, depth + 1) for item in args[0])
    if tag == "dict" and kinds == [list]:
        pairs = [pair if type(pair) is list and len(pair) == 2 else [None] for pair in args[0]]
        return {_llm_gym_decode(k, depth + 1): _llm_gym_decode(v, depth + 1) for k, v in pairs}
    raise ValueError(f"not an encoded value: {str(node)[:80]}")
"""
_CODEC_SCOPE: dict[str, Any] = {}
exec(compile(_CODEC, "<llm_gym codec>", "exec"), _CODEC_SCOPE)
_encode, _decode = _CODEC_SCOPE["_llm_gym_encode"], _CODEC_SCOPE["_llm_gym_decode"]

# Appended to the program in the sandbox: answer "[]" (loaded?) with ["ready"], and each
# [name, args, kwargs] with ["ok", value] or ["raised", exception name, message].
_SERVER = """
def __llm_gym_serve():
    import json, os, sys
    scope, replies = globals(), int(sys.argv[2])

    def send(reply):
        data = (json.dumps(reply) + "\\n").encode()
        while data:
            data = data[os.write(replies, data):]

    for line in os.fdopen(int(sys.argv[1]), "rb"):
        request = json.loads(line)
        if not request:
            send(["ready"])
            continue
        name, args, kwargs = request
        try:
            args = [_llm_gym_decode(arg) for arg in args]
            kwargs = {key: _llm_gym_decode(value) for key, value in kwargs.items()}
            reply = ["ok", _llm_gym_encode(scope[name](*args, **kwargs))]
        except BaseException as error:
            try:
                reply = ["raised", type(error).__name__, str(error)[:200]]
            except BaseException:
                reply = ["raised", "Exception", ""]
        send(reply)
__llm_gym_serve()
"""


@dataclass(frozen=True)
class CodeScore:
    """A program's verdict: ``passed`` of ``total`` tests; ``reward`` their fraction,
    ``success`` all of them; ``error``: why the program stopped answering (its last output
    line), None when it answered every call; ``uncredited``: tests it passed that are not in
    ``passed``, because a program returning None passes them too and it passed no other."""

    passed: int
    total: int
    error: str | None = None
    uncredited: int = 0

    @property
    def reward(self) -> float:
        """The fraction of tests that passed."""
        return self.passed / self.total if self.total else 0.0

    @property
    def success(self) -> bool:
        """Whether every test passed."""
        return self.total > 0 and self.passed == self.total


def _exercising(check: ast.FunctionDef, entry_point: str | None) -> Callable[[ast.AST], bool]:
    """Whether an expression of ``check``'s body calls the function under test: the check's
    parameter (``candidate``), the entry point, a name bound to one of them, or reads a name
    bound to a value computed from such a call (``solution = candidate(xs)`` then
    ``assert poly(xs, solution) == 0``), anywhere in the check."""
    callables = {arg.arg for arg in check.args.args} | ({entry_point} if entry_point else set())
    results: set[str] = set()

    def exercises(node: ast.AST) -> bool:
        for m in ast.walk(node):
            if isinstance(m, ast.Call) and isinstance(m.func, ast.Name) and m.func.id in callables:
                return True
            if isinstance(m, ast.Name) and m.id in results:
                return True
        return False

    bindings = []  # (value, the names it is bound to)
    for m in ast.walk(check):
        if isinstance(m, ast.Assign):
            bindings.append((m.value, m.targets))
        elif isinstance(m, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and m.value:
            bindings.append((m.value, [m.target]))
        elif isinstance(m, (ast.For, ast.AsyncFor, ast.comprehension)):
            bindings.append((m.iter, [m.target]))
        elif isinstance(m, ast.withitem) and m.optional_vars is not None:
            bindings.append((m.context_expr, [m.optional_vars]))
    changed = True
    while changed:  # to a fixed point: each pass adds names or stops
        changed = False
        for value, targets in bindings:
            names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if isinstance(value, ast.Name) and value.id in callables:
                kind = callables  # an alias: f = candidate
            elif exercises(value):
                kind = results
            else:
                continue
            if not names <= kind:
                kind |= names
                changed = True
    return exercises


def split_check(test: str, entry_point: str | None = None) -> tuple[str, list[tuple[str, bool]]]:
    """HumanEval's ``test`` source as (the code around ``check``, the statements of
    ``check``'s body: each one's source and whether it is a test).

    A test is a statement holding an ``assert`` that exercises the function under test: its
    expression calls ``check``'s parameter (``candidate``) or ``entry_point``, or reads a
    value the check computed from such a call. ``assert True`` (HumanEval's 48 "This prints
    if this assert fails" lines) tests nothing, so it is setup, not a test.

    >>> preamble, statements = split_check("X = 1\\ndef check(candidate):\\n    y = 2\\n"
    ...                                    "    assert candidate(y) == 4\\n    assert True\\n")
    >>> preamble.strip(), statements
    ('X = 1', [('y = 2', False), ('assert candidate(y) == 4', True), ('assert True', False)])
    """
    tree = parse(test)
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1:
        raise ValueError(f"test must define one check(candidate) function, got {len(checks)}")
    rest = [ast.unparse(n) for n in tree.body if n is not checks[0]]
    exercises = _exercising(checks[0], entry_point)

    def is_test(statement: ast.stmt) -> bool:
        return any(isinstance(m, ast.Assert) and exercises(m.test) for m in ast.walk(statement))

    statements = [(ast.unparse(n), is_test(n)) for n in checks[0].body]
    return "\n".join(rest) + "\n", statements


def extract_code(response: str, prompt: str, entry_point: str, code_format: str) -> str | None:
    """The program a response stands for: the last fenced block (``"code_block"``) or the
    whole response (``"function"``); with a ``def entry_point`` of its own it follows the
    prompt's imports, else it completes the prompt's signature. None: no code found."""
    if code_format not in CODE_FORMATS:
        raise ValueError(f"code_format must be one of {CODE_FORMATS}, got {code_format!r}")
    if len(response) > MAX_CODE_CHARS:
        return None
    if code_format == "code_block":
        blocks = _FENCE.findall(response)
        if not blocks:
            return None
        code = blocks[-1]
    else:
        code = response
    if not code.strip():
        return None
    if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE):
        imports = [line for line in prompt.splitlines() if line.startswith(("import ", "from "))]
        return "\n".join(imports) + "\n" + code
    return prompt + code


class _ProgramGone(Exception):
    """The program stopped answering: ended, ran out of time, or sent a reply too long."""


def _returned(reply: bytes) -> Any:
    """A call's value from the program's reply; the program's exception raised here (as the
    builtin of that name where there is one) when it raised; ValueError when the reply is
    not one."""
    try:
        status, *rest = json.loads(reply)
        if status == "ok" and len(rest) == 1:
            return _decode(rest[0])
        name, message = rest
    except (ValueError, TypeError, RecursionError, MemoryError) as error:
        raise ValueError(f"the program's reply is not plain data: {error}") from None
    kind = getattr(builtins, name, None) if status == "raised" and type(name) is str else None
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            error = kind(message)
        except Exception:  # an exception class that takes other arguments
            error = RuntimeError(f"{name}: {message}")
        raise error
    raise RuntimeError(f"the program raised {str(name)[:80]}: {str(message)[:200]}")


def _remote(channel: Channel, name: str) -> Callable[..., Any]:
    """The program's function ``name``, called across the channel."""

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            request = json.dumps([name, [_encode(a) for a in args],
                                  {k: _encode(v) for k, v in kwargs.items()}])  # fmt: skip
        except (TypeError, ValueError) as error:
            raise TypeError(f"{name}'s arguments must be plain data: {error}") from None
        reply = channel.request(request.encode())
        if reply is None:
            raise _ProgramGone(channel.error)
        return _returned(reply)

    call.__name__ = call.__qualname__ = name
    return call


def _private_random() -> types.ModuleType:
    """A ``random`` module with its own generator: a check's draws (``randint``, ``seed``)
    leave the grader process's global one alone."""
    module = types.ModuleType("random")
    generator = random.Random()
    for name in random.__all__:
        value = getattr(random, name)
        shared = getattr(value, "__self__", None) is getattr(random, "_inst", None)
        setattr(module, name, getattr(generator, name) if shared else value)
    return module


def _stubs(prompt: str) -> set[str]:
    """The functions a prompt declares without a body (docstring, ``pass`` or ``...``): what
    the program is to write."""
    try:
        tree = parse(prompt)
    except SyntaxError:
        return set()

    def empty(statement: ast.stmt) -> bool:
        constant = isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
        return constant or isinstance(statement, ast.Pass)

    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    return {node.name for node in functions if all(map(empty, node.body))}


def _check_scope(
    function: Callable[[str], Callable[..., Any]], prompt: str, test: str, entry_point: str
) -> dict[str, Any]:
    """The globals the check's statements run in, here: the prompt's helpers (the dataset's,
    trusted), the test's code around ``check``, and the program's functions as ``function(name)``
    gives them (``candidate``, the entry point, and any other name the test uses and nobody
    defines)."""
    private_random = _private_random()

    def import_(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "random" and not kwargs.get("level", args[3] if len(args) > 3 else 0):
            return private_random
        return builtins.__import__(name, *args, **kwargs)

    scope_builtins = dict(vars(builtins), __import__=import_, print=lambda *a, **k: None)
    scope: dict[str, Any] = {"__name__": "__llm_gym_check__", "__builtins__": scope_builtins}
    if prompt:
        try:
            exec(compile(prompt, "<prompt>", "exec"), scope)
        except Exception:  # the prompt's helpers then come from the program, as the rest
            pass
    used = {n.id for n in ast.walk(parse(test)) if isinstance(n, ast.Name)}
    remote = {entry_point, *_stubs(prompt)} | {n for n in used if n not in scope}
    for name in remote - set(scope_builtins) | {entry_point}:
        scope[name] = function(name)
    scope["candidate"] = scope[entry_point]
    return scope


def _do_nothing(name: str) -> Callable[..., None]:
    def call(*args: Any, **kwargs: Any) -> None:
        return None

    return call


@functools.lru_cache(maxsize=1024)
def _passed_by_doing_nothing(test: str, entry_point: str, prompt: str) -> frozenset[int]:
    """The indexes of ``split_check``'s statements that are tests and pass against a program
    whose every function returns None: the check's own code (trusted) run here with such
    functions, no program involved. A test among them is no evidence on its own (``assert
    not candidate(x)`` holds for None)."""
    preamble, statements = split_check(test, entry_point)
    scope = _check_scope(_do_nothing, prompt, test, entry_point)
    try:
        exec(compile(preamble, "<test>", "exec"), scope)
    except Exception:
        return frozenset()
    passed = set()
    for index, (source, is_test) in enumerate(statements):
        try:
            exec(compile(source, "<check>", "exec"), scope)
        except Exception:
            if not is_test:
                break
            continue
        if is_test:
            passed.add(index)
    return frozenset(passed)


def grade(
    program: str | None,
    test: str,
    entry_point: str,
    interpreter: PythonInterpreter,
    *,
    prompt: str = "",
) -> CodeScore:
    """Run ``program`` in ``interpreter``'s sandbox and ``test``'s ``check`` statements here,
    each call of the program's functions answered by the sandbox; never raises for anything
    the program does. ``prompt``: the problem's prompt, whose complete functions (helpers
    such as HumanEval's ``poly``) the check then uses as written, not as the program may
    have redefined them.

    A test (``split_check``: an assert that calls the function under test) passes when its
    statement runs without error while the program still answers; a statement that is not a
    test (setup) and fails stops the check. Tests that a program returning None from every
    function would pass (``assert not candidate(x)``, ``assert candidate([]) is None``) are
    credited only beside a test such a program fails: a program that does no better than
    ``return None`` scores 0 (``CodeScore.uncredited`` counts what it passed).
    """
    preamble, statements = split_check(test, entry_point)
    total = sum(is_test for _, is_test in statements)
    if program is None:
        return CodeScore(0, total, "no code in the response")
    trivial = _passed_by_doing_nothing(test, entry_point, prompt)

    def run_check(channel: Channel) -> tuple[set[int], str | None]:
        if channel.request(b"[]") != b'["ready"]':  # the program never got to its calls
            return set(), channel.error or "the program did not start answering"
        scope = _check_scope(functools.partial(_remote, channel), prompt, test, entry_point)
        try:
            exec(compile(preamble, "<test>", "exec"), scope)
        except Exception as error:  # the dataset's code: no test can run
            return set(), f"the test's code around check failed: {error!r:.160}"
        passed = set()
        for index, (source, is_test) in enumerate(statements):
            try:
                exec(compile(source, "<check>", "exec"), scope)
                ok = True
            except Exception:  # a failed assert, an error, or the program gone
                ok = False
            ok = ok and channel.error is None  # nothing counts once the program is gone
            if ok and is_test:
                passed.add(index)
            if not ok and not is_test:
                break
        return passed, channel.error

    code = f"{program}\n\n{_CODEC}\n{_SERVER}"
    (passed, why), result = interpreter.serve(code, run_check)
    # No better than returning None (unless returning None is all the tests ask for).
    uncredited = len(passed) if passed <= trivial and len(trivial) < total else 0
    credited = min(len(passed) - uncredited, total)
    if why is None:
        return CodeScore(credited, total, uncredited=uncredited)
    # Why the program stopped answering is best told by its last words (a traceback's last
    # line, the time-out); the channel's reason where it printed none.
    last = [] if why.startswith("the test's") else result.output.strip().splitlines()[-1:]
    return CodeScore(credited, total, (last or [why])[0][:200], uncredited)
