"""OpenAI's wire format as the gateway speaks it: request bodies read (each field checked, a
``BadRequest``, OpenAI's error body with a 4xx naming the parameter, for any that is wrong;
messages put in the form two requests are compared in) and replies written (a completion, or
its server-sent chunks)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llm_gym.samplers.base import SamplingSettings
from llm_gym.tools.calls import MAX_JSON_DEPTH

__all__ = [
    "MAX_BODY_DEPTH",
    "MAX_N",
    "MAX_STOPS",
    "BadRequest",
    "Request",
    "check_tree",
    "chunks",
    "completion",
    "error_body",
    "flag",
    "integer",
    "load_body",
    "messages_of",
    "normal_message",
    "number",
    "read_request",
    "stops_of",
    "tools_of",
]

MAX_N = 64  # choices a request may ask for
MAX_STOPS = 4  # OpenAI's limit on stop sequences
# Arrays and objects a body may nest: json.loads, the chat template and json.dumps recurse
# once per level (10,000 levels raised RecursionError, a 500); real bodies (a tool's JSON
# schema included) nest a dozen.
MAX_BODY_DEPTH = 64

# The fields each endpoint reads. Others get OpenAI's own 400 ("Unrecognized request
# argument"); the fields below them are accepted only at their no-op value, so that no
# setting is silently ignored.
_COMMON = {
    "model", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "stream",
    "stream_options", "logprobs", "return_token_ids", "skip_special_tokens", "user",
    "metadata", "store",
    "frequency_penalty", "presence_penalty", "logit_bias",
}  # fmt: skip
_CHAT = _COMMON | {
    "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
    "parallel_tool_calls", "response_format",
}  # fmt: skip
_COMPLETIONS = _COMMON | {"prompt", "echo", "best_of", "suffix"}
# A field -> the values that change nothing (what OpenAI does without it).
_NO_OP: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "store": (None, False),
    # vLLM's (llm_gym's OpenAISampler sends it): the reply's text keeps special tokens here.
    "skip_special_tokens": (None, False),
    "parallel_tool_calls": (None, True),
    "response_format": (None, {"type": "text"}),
}


class BadRequest(Exception):
    """An OpenAI error body: ``message``, the ``param`` at fault, the HTTP ``status``."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


def error_body(message: str, param: str | None, status: int, code: str | None) -> dict:
    """OpenAI's error JSON.

    >>> error_body("too long", "messages", 400, "context_length_exceeded")["error"]["type"]
    'invalid_request_error'
    """
    kinds = {403: "permission_error", 404: "not_found_error", 500: "server_error"}
    kind = kinds.get(status, "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def load_body(raw: bytes) -> Any:
    """The JSON of a request body, ``check_tree``'d; a ``BadRequest`` for anything else.

    >>> load_body(b'{"a": [1]}')
    {'a': [1]}
    >>> load_body(b"[" * 10000)
    Traceback (most recent call last):
    ...
    llm_gym.agents._wire.BadRequest: the request body nests arrays and objects deeper than 64 levels
    """
    try:
        body = json.loads(raw)
    except RecursionError:  # the C scanner recurses per level
        raise BadRequest(
            f"the request body nests arrays and objects deeper than {MAX_BODY_DEPTH} levels"
        ) from None
    except ValueError as error:  # UnicodeDecodeError too
        raise BadRequest(f"the request body must be a JSON object: {error}") from None
    check_tree(body)
    return body


def check_tree(value: Any, depth: int = MAX_BODY_DEPTH) -> None:
    """A ``BadRequest`` naming the place (``messages[0].content``) where ``value`` nests
    deeper than ``depth`` or holds a string that is not UTF-8 (a lone surrogate such as
    ``"\\ud800"``, which the tokenizer cannot encode). Walked without recursion.

    >>> try:
    ...     check_tree({"messages": [{"content": chr(0xD800)}]})
    ... except BadRequest as error:
    ...     print(error.param)
    messages[0].content
    """
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, where, level = stack.pop()
        if isinstance(item, str):
            _utf8(item, where)
            continue
        if not isinstance(item, (dict, list)):
            continue
        if level >= depth:
            raise BadRequest(  # the path itself would be as deep: its start is named
                f"{_top(where) or 'the request body'} nests arrays and objects deeper than "
                f"{depth} levels", _top(where),
            )  # fmt: skip
        if isinstance(item, dict):
            for key, child in item.items():
                _utf8(key, where)
                stack.append((child, f"{where}.{key}" if where else key, level + 1))
        else:
            stack.extend((child, f"{where}[{i}]", level + 1) for i, child in enumerate(item))


def _utf8(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        bad = text[error.start : error.start + 1]
        raise BadRequest(
            f"{where or 'the request body'} holds a lone UTF-16 surrogate ({bad!r}): text "
            "must be valid Unicode",
            where or None,
        ) from None


def _top(where: str) -> str | None:
    """The parameter a path starts in.

    >>> _top("messages[0].content[1]"), _top("")
    ('messages', None)
    """
    return where.split(".")[0].split("[")[0] if where else None


def _known_fields(body: Mapping, chat: bool) -> None:
    known = _CHAT if chat else _COMPLETIONS
    for key in body:
        if key not in known:
            raise BadRequest(f"Unrecognized request argument supplied: {key}", key)
    for key, neutral in _NO_OP.items():
        value = body.get(key)
        if key in known and value is not None and not any(
            value == v and isinstance(value, bool) == isinstance(v, bool) for v in neutral
        ):  # fmt: skip
            raise BadRequest(
                f"{key}={body[key]!r:.60} is not supported by this gateway: it samples the "
                f"policy's own distribution (leave {key} out)",
                key,
            )


def number(body: Mapping, key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise BadRequest(f"{key} must be a number in [{low:g}, {high:g}], got {value!r:.40}", key)
    return float(value)


def integer(body: Mapping, key: str, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    bad = isinstance(value, bool) or not isinstance(value, int) or value < low
    if bad or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise BadRequest(f"{key} must be an integer {bound}, got {value!r:.40}", key)
    return value


def stops_of(body: Mapping) -> list[str]:
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop
    if stops is None:
        return []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise BadRequest(f"stop must be a string or a list of strings, got {stop!r:.60}", "stop")
    if len(stops) > MAX_STOPS:
        raise BadRequest(f"stop holds at most {MAX_STOPS} sequences, got {len(stops)}", "stop")
    return [s for s in stops if s]


def flag(body: Mapping, key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{key} must be a boolean, got {value!r:.40}", key)
    return value


def normal_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A chat message as compared when a request repeats an earlier reply: role, text and
    tool calls (name and decoded arguments; ids and fields SDKs add are left out)."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        function = function if isinstance(function, Mapping) else call
        arguments = function.get("arguments") if isinstance(function, Mapping) else None
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass
        name = function.get("name") if isinstance(function, Mapping) else None
        calls.append((name, json.dumps(arguments, sort_keys=True)))
    normal = {"role": message.get("role"), "content": content or ""}
    if calls:
        normal["tool_calls"] = calls
    if message.get("tool_call_id") is not None:
        normal["tool_call_id"] = message.get("tool_call_id")
    return normal


def messages_of(body: Mapping) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        got = "an empty list" if messages == [] else type(messages).__name__
        raise BadRequest(f"messages must be a non-empty list of messages, got {got}", "messages")
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, Mapping) else None
        if not isinstance(role, str):
            raise BadRequest(
                f"messages[{i}] must be an object with a string 'role', got {message!r:.80}",
                f"messages[{i}]",
            )
        calls = message.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise BadRequest(
                f"messages[{i}].tool_calls must be a list of tool calls, got "
                f"{type(calls).__name__}",
                f"messages[{i}].tool_calls",
            )
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise BadRequest(
                f"messages[{i}].content must be a string or a list of content parts, got "
                f"{type(content).__name__}",
                f"messages[{i}].content",
            )
    return messages


def tools_of(body: Mapping) -> tuple[list[dict], bool]:
    """The request's function schemas and whether replies are read for tool calls (a named
    ``tool_choice``: that tool alone is listed to the model)."""
    tools, choice = body.get("tools") or [], body.get("tool_choice", "auto")
    shape = 'tools must be a list of {"type": "function", "function": {"name": ..., ...}}'
    if not isinstance(tools, list):
        raise BadRequest(f"{shape}, got {type(tools).__name__}", "tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise BadRequest(f"{shape}: tools[{i}] is {tool!r:.80}", "tools")
        if tool.get("type", "function") != "function":
            raise BadRequest(
                f"tools[{i}].type must be 'function', got {tool.get('type')!r:.40}",
                f"tools[{i}].type",
            )
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise BadRequest(
                f"tools[{i}].function.parameters must be a JSON Schema object, got "
                f"{parameters!r:.60}",
                f"tools[{i}].function.parameters",
            )
    named = isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping)
    if choice not in (None, "auto", "none", "required") and not named:
        raise BadRequest(
            "tool_choice must be 'auto', 'none', 'required' or "
            f'{{"type": "function", "function": {{"name": ...}}}}, got {choice!r:.60}',
            "tool_choice",
        )
    if choice == "none":  # the model is told of no tool, and its text is only text
        return [], False
    if named:
        name = choice["function"].get("name")
        tools = [t for t in tools if t["function"]["name"] == name]
        if not tools:
            raise BadRequest(
                f"tool_choice names the function {name!r:.60}, which tools does not list",
                "tool_choice",
            )
    return [dict(t) for t in tools], bool(tools)


def _arguments_depth(messages: list) -> None:
    """A ``BadRequest`` for a tool call's arguments nested past ``MAX_JSON_DEPTH`` (they are
    JSON read here and re-written in the prompt: each level is a recursion)."""
    for i, message in enumerate(messages):
        for j, call in enumerate(message.get("tool_calls") or ()):
            function = call.get("function") if isinstance(call, Mapping) else None
            arguments = function.get("arguments") if isinstance(function, Mapping) else None
            if not isinstance(arguments, str):
                continue
            where = f"messages[{i}].tool_calls[{j}].function.arguments"
            try:
                check_tree(json.loads(arguments), MAX_JSON_DEPTH)
            except RecursionError:
                raise BadRequest(
                    f"{where} nests arrays and objects deeper than {MAX_JSON_DEPTH} levels",
                    where,
                ) from None
            except BadRequest as error:
                raise BadRequest(f"{where}: {error}", where) from None
            except ValueError:
                continue  # not JSON: kept as text, as OpenAI's API keeps it


@dataclass(frozen=True)
class Request:
    """A request body as read once, every field checked (a ``BadRequest`` for any that is
    wrong): what the gateway samples with and how it replies.

    ``settings`` differ from the sampler's own where given (requests with equal settings
    share a batch); ``n`` choices; ``stops`` cut the reply; ``log_probs`` of the sampled
    tokens in the reply; ``return_token_ids`` (vLLM's); ``stream`` and ``include_usage``
    (its ``stream_options``). A chat request has its ``messages`` (as sent, and ``normal``:
    as a later request repeating them is compared), the tools' ``schemas`` and whether the
    reply is read for tool calls (``read_calls``); a completions request has its ``prompt``
    (a string or token ids, checked against the vocabulary by the gateway)."""

    chat: bool
    settings: SamplingSettings
    n: int = 1
    stops: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    log_probs: bool = False
    return_token_ids: bool = False
    messages: tuple[dict[str, Any], ...] = ()
    normal: tuple[dict[str, Any], ...] = ()
    schemas: tuple[dict, ...] = ()
    read_calls: bool = False
    prompt: Any = None


def read_request(body: Mapping, model_name: str, chat: bool) -> Request:
    """The ``Request`` of a body sent to ``model_name``'s chat (``chat``) or completions
    endpoint (completions: ``max_tokens`` 16 unless given, as OpenAI's)."""
    if not isinstance(body, Mapping):
        raise BadRequest(f"the request body must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if model != model_name:
        raise BadRequest(
            f"The model {model!r} does not exist: this gateway serves {model_name!r}",
            "model", 404, "model_not_found",
        )  # fmt: skip
    _known_fields(body, chat)
    max_tokens = integer(body, "max_completion_tokens", 1) if chat else None
    if max_tokens is None:
        max_tokens = integer(body, "max_tokens", 1)
    if max_tokens is None and not chat:
        max_tokens = 16  # OpenAI's default for completions
    settings = SamplingSettings(
        temperature=number(body, "temperature", 0.0, 2.0),
        top_p=number(body, "top_p", 0.0, 1.0),
        max_new_tokens=max_tokens,
        seed=integer(body, "seed", 0, 2**63 - 1),
    )
    n = integer(body, "n", 1, MAX_N) or 1
    if n > 1 and settings.temperature == 0.0:
        raise BadRequest(f"n={n} needs temperature > 0: greedy choices are all the same", "n")
    stops, stream = tuple(stops_of(body)), flag(body, "stream")
    options = body.get("stream_options")
    common = {
        "chat": chat, "settings": settings, "n": n, "stops": stops, "stream": stream,
        "include_usage": isinstance(options, Mapping) and bool(options.get("include_usage")),
        "return_token_ids": flag(body, "return_token_ids"),
    }  # fmt: skip
    if chat:
        log_probs = flag(body, "logprobs")
        top = integer(body, "top_logprobs", 0, 20) or 0
        messages = messages_of(body)
        _arguments_depth(messages)
        normal = tuple(normal_message(m) for m in messages)  # as a later request repeats them
        schemas, read_calls = tools_of(body)
        _no_top(top, "top_logprobs")
        return Request(
            **common, log_probs=log_probs, messages=tuple(messages), normal=normal,
            schemas=tuple(schemas), read_calls=read_calls,
        )  # fmt: skip
    logprobs = integer(body, "logprobs", 0, 5)
    if flag(body, "echo"):
        raise BadRequest("echo is not supported: the prompt is not scored here", "echo")
    _no_top(logprobs or 0, "logprobs")
    return Request(**common, log_probs=logprobs is not None, prompt=body.get("prompt"))


def _no_top(top: int, param: str) -> None:
    if top:
        raise BadRequest(
            f"{param} > 0 is not supported: the sampled token's own log-prob is returned "
            "(logprobs true, top_logprobs 0)",
            param,
        )


def completion(
    head: dict, choices: list[dict], chat: bool, usage: dict, extra: dict
) -> dict[str, Any]:
    """The reply of a request that does not stream: OpenAI's ``chat.completion`` or
    ``text_completion`` of ``choices`` (each with its ``logprobs`` JSON or None)."""
    out = []
    for choice in choices:
        item: dict[str, Any] = {"index": choice["index"]}
        if chat:
            item["message"] = choice["message"]
        else:
            item["text"] = choice["content"]
        item["logprobs"] = choice["logprobs"]
        item["finish_reason"] = choice["finish_reason"]
        if extra["return_token_ids"]:  # vLLM's: the ids as sampled
            item["token_ids"] = choice["tokens"].tolist()
        out.append(item)
    payload = {**head, "object": "chat.completion" if chat else "text_completion"}
    payload.update(choices=out, usage=usage)
    if extra["return_token_ids"]:
        payload["prompt_token_ids"] = extra["prompt"].tolist()
    return payload


async def chunks(head: dict, choices: list[dict], chat: bool, usage: dict | None) -> Any:
    """The server-sent events of a streamed reply: each choice's role, content, tool calls
    and finish as OpenAI's chunks, the usage if asked for, then ``[DONE]``."""
    kind = "chat.completion.chunk" if chat else "text_completion"

    def event(choice_rows: list[dict], **more: Any) -> str:
        return f"data: {json.dumps({**head, 'object': kind, 'choices': choice_rows, **more})}\n\n"

    for choice in choices:
        i = choice["index"]
        lp = choice["logprobs"]
        if chat:
            yield event([{"index": i, "delta": {"role": "assistant", "content": ""},
                          "logprobs": None, "finish_reason": None}])  # fmt: skip
            message = choice["message"]
            if message.get("content"):
                yield event([{"index": i, "delta": {"content": message["content"]},
                              "logprobs": lp, "finish_reason": None}])  # fmt: skip
                lp = None
            for j, call in enumerate(message.get("tool_calls") or ()):
                yield event([{"index": i, "delta": {"tool_calls": [{"index": j, **call}]},
                              "logprobs": lp, "finish_reason": None}])  # fmt: skip
                lp = None
            yield event([{"index": i, "delta": {}, "logprobs": lp,
                          "finish_reason": choice["finish_reason"]}])  # fmt: skip
        else:
            yield event([{"index": i, "text": choice["content"], "logprobs": lp,
                          "finish_reason": choice["finish_reason"]}])  # fmt: skip
    if usage is not None:
        yield event([], usage=usage)
    yield "data: [DONE]\n\n"
