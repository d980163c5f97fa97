"""An agent program written with the official ``openai`` SDK, nothing of llm_gym: a tool loop
whose ``calculate`` tool it runs itself. ``llm-gym train --agent
examples/calculator_agent.py:solve`` trains the model behind it through llm_gym's gateway
(docs/agents.md)."""

import ast
import json
import operator

from openai import OpenAI

TOOLS = [{"type": "function", "function": {
    "name": "calculate", "description": "The value of an arithmetic expression (+ - * / and ints)",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]},
}}]  # fmt: skip


def solve(base_url: str, api_key: str, item: dict) -> str:
    client = OpenAI(base_url=base_url, api_key=api_key)
    messages = list(item["messages"])
    for _ in range(4):
        reply = (
            client.chat.completions.create(
                model="policy", messages=messages, tools=TOOLS, max_tokens=96
            )
            .choices[0]
            .message
        )
        messages.append(reply)
        if not reply.tool_calls:
            return reply.content or ""
        for call in reply.tool_calls:
            result = calculate(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.Div: operator.truediv, ast.USub: operator.neg}  # fmt: skip


def calculate(expression: str = "", **_: object) -> str:
    """The expression's value, read with ``ast`` (never ``eval``: the text is the model's)."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")

    try:
        return str(value(ast.parse(str(expression)[:200], mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError) as error:
        return f"error: {error}"
