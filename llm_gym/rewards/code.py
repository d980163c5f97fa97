"""Code graded by its unit tests in llm_gym's sandbox (``PythonInterpreter``): HumanEval's
``check(candidate)`` split into its top-level asserts, each counted on its own.

Model output is hostile input: the program runs in a fresh sandboxed interpreter with its
limits (time, memory, processes, file size, no network, no host files under bubblewrap); the
verdict is the last line the harness prints after the tests, marked with a nonce drawn per
run, so a completion that prints or exits early scores 0. The host never ``exec``s it.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from llm_gym.tools.interpreter import PythonInterpreter

__all__ = ["CODE_FORMATS", "CodeScore", "extract_code", "grade", "split_check"]

CODE_FORMATS = ("code_block", "function")  # a fenced ```python block, or the bare function
_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)
MAX_CODE_CHARS = 20_000  # a longer "function" is no answer; refusing it bounds the work

# Runs the candidate, then each top-level statement of check's body: an assert (or a block
# holding one) is a test, counted alone; other statements set up the rest.
_HARNESS = """
def __llm_gym_tests(candidate):
    import json as __json
    passed = 0
    __scope = dict(globals(), candidate=candidate)
    for __code, __is_test in {statements!r}:
        try:
            exec(__code, __scope)
            passed += __is_test
        except BaseException:
            if not __is_test:
                break
    print("\\n{nonce}", __json.dumps(passed))
__llm_gym_tests({entry_point})
"""


@dataclass(frozen=True)
class CodeScore:
    """A program's verdict: ``passed`` of ``total`` tests; ``reward`` their fraction,
    ``success`` all of them; ``error``: why none ran (None when the harness reported)."""

    passed: int
    total: int
    error: str | None = None

    @property
    def reward(self) -> float:
        """The fraction of tests that passed."""
        return self.passed / self.total if self.total else 0.0

    @property
    def success(self) -> bool:
        """Whether every test passed."""
        return self.total > 0 and self.passed == self.total


def split_check(test: str) -> tuple[str, list[tuple[str, bool]]]:
    """HumanEval's ``test`` source as (the code around ``check``, the statements of
    ``check``'s body: each one's source and whether it is a test, i.e. holds an assert).

    >>> preamble, statements = split_check("X = 1\\ndef check(candidate):\\n    y = 2\\n"
    ...                                    "    assert candidate(y) == 4\\n")
    >>> preamble.strip(), statements
    ('X = 1', [('y = 2', False), ('assert candidate(y) == 4', True)])
    """
    tree = ast.parse(test)
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1:
        raise ValueError(f"test must define one check(candidate) function, got {len(checks)}")
    rest = [ast.unparse(n) for n in tree.body if n is not checks[0]]
    statements = [
        (ast.unparse(n), any(isinstance(m, ast.Assert) for m in ast.walk(n)))
        for n in checks[0].body
    ]
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


def grade(
    program: str | None, test: str, entry_point: str, interpreter: PythonInterpreter
) -> CodeScore:
    """Run ``program`` and then ``test``'s ``check`` statements in ``interpreter``'s sandbox;
    never raises for anything the program does."""
    preamble, statements = split_check(test)
    total = sum(is_test for _, is_test in statements)
    if program is None:
        return CodeScore(0, total, "no code in the response")
    nonce = secrets.token_hex(16)
    harness = _HARNESS.format(statements=statements, nonce=nonce, entry_point=entry_point)
    result = interpreter.run(f"{program}\n\n{preamble}\n{harness}")
    lines = [line for line in result.output.splitlines() if line.startswith(nonce + " ")]
    if not result.ok or not lines:
        last = result.output.strip().splitlines()[-1:] or ["no output"]
        return CodeScore(0, total, last[0][:200])
    passed: Any = json.loads(lines[-1].split(" ", 1)[1])
    return CodeScore(min(int(passed), total), total)
