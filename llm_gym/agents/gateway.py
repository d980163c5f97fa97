"""``Gateway``: an OpenAI-compatible server in front of any llm_gym ``Sampler`` that records
every call of an episode token for token, so that an agent program written against the
OpenAI API (the ``openai`` SDK, the OpenAI Agents SDK, LangGraph, a coding harness) trains
through llm_gym unmodified (docs: agents.md).

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/completions``
(streamed or not; ``n``, ``temperature``, ``top_p``, ``max_tokens`` /
``max_completion_tokens``, ``stop``, ``seed``, ``logprobs``; ``tools``, ``tool_choice`` and
``tool_calls`` in replies, read with llm_gym's hermes format), ``GET /health``, and
``GET``/``DELETE /v1/episodes/{name}`` (an episode's recorded calls with their token ids).

A request names its episode with the ``X-Episode-Id`` header, else its API key (the bearer
token; AReaL's and rLLM's way). An episode belongs to the key that opened it: only that key
(or the gateway's ``admin_key``) extends, reads or deletes it; other keys get a 404. The
calls of a named episode are recorded (``Call``), the
prompt ids as the chat template gave them, the completion's ids as the sampler returned them
(never re-tokenized), their log-probs, the policy version and the finish reason. A chat
request whose messages are an earlier call's messages plus that call's reply continues that
call's token sequence (``recording``). Requests in flight together are sampled in one batch.

Limits, so that no caller starves or breaks the others: a body over ``max_body_bytes`` is a
413 before it is read as JSON; a prompt as long as the model's context is a 400
(``context_length_exceeded``) and ``max_tokens`` is capped at the context less the prompt;
replies are sampled ``chunk_tokens`` at a time, every request in flight getting its next
chunk in turn, and a request whose client hung up is dropped between chunks (never
recorded); episodes are kept ``episode_ttl`` seconds after their last call, ``max_episodes``
at most.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from llm_gym.agents import limits
from llm_gym.agents._wire import (
    BadRequest,
    Request,
    chunks,
    completion,
    error_body,
    load_body,
    normal_message,
    read_request,
)
from llm_gym.agents.recording import Call, Recorder
from llm_gym.agents.turns import Turns
from llm_gym.chat.conversation import Conversation, PromptBuilder
from llm_gym.chat.history import History
from llm_gym.checks import check_choice, check_int
from llm_gym.samplers.base import Sample, Sampler, check_sampler
from llm_gym.samplers.batching import BatchingSampler
from llm_gym.servers import ThreadedServer
from llm_gym.tools.calls import (
    TOOL_FORMATS,
    chat_messages,
    parse_tool_calls,
    strip_tool_calls,
    with_tools_prompt,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["EPISODE_HEADER", "MAX_BODY_BYTES", "Gateway"]

EPISODE_HEADER = "x-episode-id"
MAX_BODY_BYTES = 8 * 2**20  # a request body's bytes at most (8 MiB)
_DRAIN_BYTES = 64 * 2**20  # of a body too large, read and dropped so that its 413 arrives


class Gateway:
    """An OpenAI-compatible endpoint over ``sampler`` that records each episode's calls.

    Args:
        sampler: any llm_gym ``Sampler`` (a ``TransformersSampler`` or ``TransformersPolicy``,
            ``VLLMSampler``, ``OpenAISampler``): the policy the agent's calls sample from. A
            request's ``temperature``, ``top_p``, ``max_tokens`` and ``seed`` override the
            sampler's own through its ``with_settings`` (every llm_gym sampler has it); a
            sampler without it takes requests without them.
        tokenizer: the model's tokenizer: chat template, tokenizing, decoding.
        model_name: the name ``/v1/models`` lists and requests must name (404 otherwise).
        template_kwargs: ``chat_template_name`` / ``chat_template`` (default: the
            tokenizer's, as ChatEnv chooses).
        tool_format: how tool calls are written and read (``"hermes"``).
        max_batch: prompts sampled in one batch at most.
        batch_wait: seconds the sampling thread waits for one more call while fewer calls
            than its last batch had are in (0: it never waits: a batch is whatever calls are
            in when the sampler is free).
        context_length: positions of the model, prompt and reply together (default:
            ``context_length(sampler, tokenizer)``; None there: no limit checked here).
        chunk_tokens: tokens sampled per turn of a request: requests in flight take turns,
            so a long reply delays a short one by one chunk; None: a reply in one call (as a
            sampler without ``with_settings``, or sampling ``num_samples`` > 1, always is).
        max_body_bytes: a request body's bytes at most (a 413 past it).
        api_key: when given, callers must send it (or a key from ``issue_key``) as their
            bearer token, else a 401; None: any key is a caller's own.
        admin_key: the key that reads, extends and deletes every episode (default:
            ``api_key`` when given, else a random one, ``gateway.admin_key``).
        episode_ttl: seconds an episode is kept after its last call (None: until popped).
        max_episodes: episodes kept at most (the one called longest ago goes first).

    ``serve(host, port)`` starts the HTTP server in a thread (``url``); ``recorder`` holds
    the calls (``recorder.pop(name)``: an episode's calls, forgotten by the gateway);
    ``batching`` is the ``BatchingSampler`` the calls go through; ``cancelled`` counts the
    requests dropped because their client hung up.
    """

    def __init__(
        self,
        sampler: Sampler,
        tokenizer: PreTrainedTokenizerBase,
        *,
        model_name: str = "llm-gym",
        template_kwargs: Mapping[str, Any] | None = None,
        tool_format: str = "hermes",
        max_batch: int = 64,
        batch_wait: float = 0.02,
        context_length: int | None | str = "auto",
        chunk_tokens: int | None = 16,
        max_body_bytes: int = MAX_BODY_BYTES,
        api_key: str | None = None,
        admin_key: str | None = None,
        episode_ttl: float | None = 3600.0,
        max_episodes: int = 1024,
    ) -> None:
        check_sampler(sampler)
        if not isinstance(model_name, str) or not model_name:
            raise ValueError(f"model_name must be a non-empty string, got {model_name!r}")
        self.sampler, self.tokenizer, self.model_name = sampler, tokenizer, model_name
        self.tool_format = check_choice("tool_format", tool_format, TOOL_FORMATS)
        self.batching = BatchingSampler(sampler, max_batch=max_batch, batch_wait=batch_wait)
        self.max_batch, self.batch_wait = self.batching.max_batch, self.batching.batch_wait
        self.builder = PromptBuilder(tokenizer, template_kwargs, need_tokens=True)
        self.codec = self.builder.codec
        self.recorder = Recorder(episode_ttl, max_episodes)
        if context_length == "auto":
            context_length = limits.context_length(sampler, tokenizer)
        self.context_length = (
            None if context_length is None else check_int("context_length", context_length, 2)
        )
        self.chunk_tokens = None if chunk_tokens is None else check_int(
            "chunk_tokens", chunk_tokens, 1
        )  # fmt: skip
        self.max_body_bytes = check_int("max_body_bytes", max_body_bytes, 1)
        for name, key in (("api_key", api_key), ("admin_key", admin_key)):
            if key is not None and (not isinstance(key, str) or not key.strip()):
                raise ValueError(f"{name} must be a non-empty string or None, got {key!r}")
        self.api_key = api_key
        self.admin_key = admin_key or api_key or f"llm-gym-admin-{secrets.token_hex(16)}"
        self._issued: set[str] = set()
        self._budget = limits.default_budget(sampler)
        self._token_bytes = limits.max_token_bytes(tokenizer)
        self.turns = Turns(self.batching, self.codec, self.chunk_tokens, self.context_length)
        self._server: ThreadedServer | None = None
        self.url: str | None = None
        self.app = self._make_app()

    def __repr__(self) -> str:
        return f"Gateway({self.sampler!r}, model_name={self.model_name!r}, url={self.url!r})"

    # -- serving -----------------------------------------------------------------------------

    @property
    def cancelled(self) -> int:
        """Requests dropped because their client hung up (``Turns.cancelled``)."""
        return self.turns.cancelled

    def issue_key(self) -> str:
        """A new random API key this gateway accepts (with ``api_key`` set, a caller needs
        one, or ``api_key``): an agent's own, owning the episodes it opens."""
        key = f"llm-gym-{secrets.token_hex(16)}"
        self._issued.add(key)
        return key

    def revoke_key(self, key: str) -> None:
        """Stop accepting ``key`` (one ``issue_key`` gave)."""
        self._issued.discard(key)

    def serve(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Start the server in a thread (port 0: a free one); its URL (``/v1`` is the API)."""
        self._server = ThreadedServer(self.app, host=host, port=port)
        self.url = self._server.start()
        return self.url

    def wait(self) -> None:
        """Block until the server stops (Ctrl-C stops it)."""
        if self._server is not None:
            self._server.wait()

    def close(self) -> None:
        """Stop the server and the sampling thread (the sampler is the caller's)."""
        if self._server is not None:
            self._server.stop()
            self._server = None
        self.batching.close()

    def __enter__(self) -> Gateway:
        if self.url is None:
            self.serve()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make_app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route

        return Starlette(routes=[
            Route("/health", self._health, methods=["GET"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/v1/episodes/{name}", self._episode, methods=["GET", "DELETE"]),
        ])  # fmt: skip

    # -- endpoints ---------------------------------------------------------------------------

    async def _health(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse({"status": "ok"})

    def _refused(self, request: Any) -> Any:
        """OpenAI's 401 for a caller without an accepted key (None: accepted)."""
        from starlette.responses import JSONResponse

        if self.api_key is None:
            return None
        key = _bearer(request)
        if key is not None and (key in (self.api_key, self.admin_key) or key in self._issued):
            return None
        shown = "none" if key is None else f"{key[:3]}...{key[-4:]}" if len(key) > 8 else "***"
        message = (
            f"Incorrect API key provided: {shown}. This gateway needs its --api-key (or a key "
            "it issued) as the bearer token"
        )
        return JSONResponse(
            error_body(message, None, 401, "invalid_api_key"), status_code=401,
            headers={"www-authenticate": "Bearer"},
        )  # fmt: skip

    async def _models(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        refused = self._refused(request)
        if refused is not None:
            return refused
        model = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "llm_gym"}
        return JSONResponse({"object": "list", "data": [model]})

    async def _episode(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        refused = self._refused(request)
        if refused is not None:
            return refused
        name, key = request.path_params["name"], _bearer(request)
        # Another key's episode is as absent as one never recorded: no 403 that says it exists.
        mine = key == self.admin_key or (key is not None and self.recorder.owner(name) == key)
        calls = []
        if mine:
            calls = self.recorder.pop(name) if request.method == "DELETE" else (
                self.recorder.calls(name)
            )  # fmt: skip
        if not calls:
            message = f"no calls recorded for episode {name!r} under this API key"
            return JSONResponse(error_body(message, "name", 404, None), status_code=404)
        return JSONResponse({"episode": name, "calls": [_call_json(c) for c in calls]})

    async def _chat(self, request: Any) -> Any:
        return await self._handle(request, chat=True)

    async def _completions(self, request: Any) -> Any:
        return await self._handle(request, chat=False)

    async def _body(self, request: Any) -> bytes:
        """The request's body; a 413 ``BadRequest`` past ``max_body_bytes``, before any
        of it is read as JSON (the rest is read and dropped, so that the client, still
        sending, gets the 413)."""
        limit = self.max_body_bytes
        declared = request.headers.get("content-length", "")
        size, pieces, over = 0, [], declared.isdigit() and int(declared) > limit
        async for piece in request.stream():
            size += len(piece)
            over = over or size > limit
            if not over:
                pieces.append(piece)
            elif size > limit + _DRAIN_BYTES:
                break
        if over:
            raise BadRequest(
                f"the request body is {max(size, int(declared or 0)):,} bytes, more than this "
                f"gateway's limit of {limit:,} (--max-body-bytes)",
                None, 413, "request_too_large",
            )  # fmt: skip
        return b"".join(pieces)

    async def _handle(self, request: Any, chat: bool) -> Any:
        from starlette.responses import JSONResponse

        request.state.received = time.perf_counter()
        refused = self._refused(request)
        if refused is not None:
            return refused
        try:
            body = read_request(load_body(await self._body(request)), self.model_name, chat)
            return await self._reply(request, body)
        except BadRequest as error:
            body = error_body(str(error), error.param, error.status, error.code)
            return JSONResponse(body, status_code=error.status)
        except Exception as error:  # the sampler's failure: the server's error, not the agent's
            message = f"sampling failed: {type(error).__name__}: {error}"
            return JSONResponse(error_body(message, None, 500, None), status_code=500)

    async def _reply(self, request: Any, body: Request) -> Any:
        from starlette.responses import JSONResponse, Response, StreamingResponse

        chat = body.chat
        if body.settings.given() and not self.batching.configurable:
            raise BadRequest(
                f"this gateway's sampler ({type(self.sampler).__name__}) samples with its own "
                "settings: leave out temperature, top_p, max_tokens and seed",
                "temperature",
            )
        key = _bearer(request)
        episode = request.headers.get(EPISODE_HEADER) or key
        admin = key == self.admin_key
        if episode and self.recorder.is_closed(episode):
            raise BadRequest(
                f"episode {episode!r} is over (its run ended or ran past its time limit)",
                None, 403, "episode_closed",
            )  # fmt: skip
        if episode and not admin and not self.recorder.claim(episode, key):
            raise BadRequest(
                f"no episode {episode!r} under this API key (an episode belongs to the key "
                "that opened it)",
                EPISODE_HEADER, 404, "episode_not_found",
            )  # fmt: skip
        limits.check_text_size(body, self.context_length, self._token_bytes)
        normal = list(body.normal)
        if chat:
            messages, schemas = list(body.messages), list(body.schemas)
            try:
                prompt, parent, conversation = self._chat_prompt(episode, messages, normal, schemas)
            except Exception as error:  # the template's own refusal (a role it has no turn for)
                raise BadRequest(
                    "messages cannot be rendered with the model's chat template: "
                    f"{type(error).__name__}: {error}",
                    "messages",
                ) from None
        else:
            prompt, parent, conversation = self._text_prompt(episode, body.prompt)
        budget = limits.reply_budget(
            len(prompt.tokens), body.settings.max_new_tokens, self._budget, self.context_length,
            chat,
        )  # fmt: skip
        stops = list(body.stops)
        sampled = await self.turns.sample(
            request, prompt.tokens, body.n, body.settings, budget, stops
        )
        if sampled is None or await request.is_disconnected():  # nobody to answer: no record
            if sampled is not None:
                self.turns.cancelled += 1
            return Response(status_code=499)  # nginx's "client closed request": never sent
        samples, queued, sampling = sampled
        read_calls, want_log_probs = body.read_calls, body.log_probs
        choices = [self._choice(s, stops, read_calls) for s in samples]
        first = 0
        if episode:
            try:
                first = self.recorder.reserve(episode, len(choices), key, admin=admin)
            except LookupError:  # opened by another key while this one sampled
                raise BadRequest(
                    f"no episode {episode!r} under this API key",
                    EPISODE_HEADER,
                    404,
                    "episode_not_found",
                ) from None
        reply_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        for i, choice in enumerate(choices):
            choice["index"] = i
            choice["logprobs"] = self._log_probs_json(choice, chat) if want_log_probs else None
            if episode:
                call = Call(
                    first + i, prompt.tokens, prompt.mask, parent, choice["tokens"],
                    choice["log_probs"], choice["version"], choice["finish_reason"],
                    choice["content"] or "", "chat" if chat else "completions",
                )  # fmt: skip
                turn = None
                if chat:  # what a later request may continue: the prompt and what was said
                    state = (conversation, choice["said"])
                    turn = (normal, normal_message(choice["message"]), state)
                self.recorder.add(episode, call, turn)
        usage = {
            "prompt_tokens": len(prompt.tokens),
            "completion_tokens": sum(len(c["tokens"]) for c in choices),
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        head = {"id": reply_id, "created": int(time.time()), "model": self.model_name}
        # What the call waited for the sampler (a batch before it) and what its batch's
        # sampling took: the rest of its latency is the gateway's own.
        headers = {"x-policy-version": str(samples[0].version)}
        headers["x-queue-seconds"], headers["x-sampling-seconds"] = (
            f"{queued:.6f}",
            f"{sampling:.6f}",
        )
        extra = {"return_token_ids": body.return_token_ids, "prompt": prompt.tokens}
        if not body.stream:  # the gateway's own time: all but the wait and the sampling
            payload = completion(head, choices, chat, usage, extra)
            own = time.perf_counter() - request.state.received - queued - sampling
            headers["x-gateway-seconds"] = f"{own:.6f}"
            return JSONResponse(payload, headers=headers)
        events = chunks(head, choices, chat, usage if body.include_usage else None)
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)

    # -- prompts -----------------------------------------------------------------------------

    def _chat_prompt(
        self, episode: str | None, messages: list, normal: list[dict], schemas: list[dict]
    ) -> tuple[_Prompt, int | None, Conversation]:
        """The prompt of a chat request: the continuation of the episode's call whose messages
        and reply ``messages`` repeat (``normal``: as compared), token-in, token-out; else the
        template's rendering."""
        found = self.recorder.extends(episode, normal) if episode else None
        if found is not None:
            call, (conversation, said), covered = found
            added = chat_messages(messages[covered:])  # tool results, the user's next turn
            extended, _ = self.builder.extend(conversation, said, call.tokens, added)
            if extended.policy_mask is not None:  # else the template rewrote earlier turns
                return _Prompt(extended.tokens, extended.policy_mask), call.index, extended
        converted = [  # OpenAI's "developer" role is its system role for newer models
            {**m, "role": "system"} if m["role"] == "developer" else m
            for m in chat_messages(messages)
        ]
        converted = with_tools_prompt(converted, schemas, self.tool_format)
        (conversation,) = self.builder.start([History(converted)])
        return _Prompt(conversation.tokens, conversation.policy_mask), None, conversation

    def _text_prompt(self, episode: str | None, prompt: object) -> tuple[_Prompt, int | None, None]:
        """The prompt of a completions request: its token ids as given, or its text's."""
        if isinstance(prompt, str) and prompt:
            ids = self.codec.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):  # fmt: skip
            vocab = self.codec.vocab_size
            bad = next((t for t in prompt if not 0 <= t < vocab), None)  # 2**70: no int64
            if bad is not None:
                raise BadRequest(
                    f"prompt token ids must lie in [0, {vocab}), got {bad!r:.40}", "prompt"
                )
            ids = np.asarray(prompt, dtype=np.int64)
        else:
            raise BadRequest(
                "prompt must be a non-empty string or a non-empty list of token ids, got "
                f"{prompt!r:.60}",
                "prompt",
            )
        found = self.recorder.extends_tokens(episode, ids) if episode else None
        if found is not None:
            call, mask = found
            return _Prompt(ids, mask), call.index, None
        return _Prompt(ids, np.zeros(len(ids), np.bool_)), None, None

    # -- replies -----------------------------------------------------------------------------

    def _choice(self, sample: Sample, stops: list[str], read_calls: bool) -> dict[str, Any]:
        """A sample as a reply: its text (less the end-of-turn token, cut before a stop
        string), tool calls, and the tokens kept for the record."""
        tokens, log_probs = sample.tokens, sample.log_probs
        (text,) = self.codec.decode_many([tokens], skip_special_tokens=False)
        end = self.codec.end_of_turn(tokens)
        said = text[: -len(end)] if end and text.endswith(end) else text
        content, finish = said, sample.finish_reason
        hits = [at for at in (said.find(stop) for stop in stops) if at >= 0]
        if hits:
            content, finish = said[: min(hits)], "stop"
            keep = self._tokens_to(tokens, stops)
            tokens = tokens[:keep]
            log_probs = None if log_probs is None else log_probs[:keep]
            (said,) = self.codec.decode_many([tokens], skip_special_tokens=False)
        calls = []
        if read_calls:
            parsed = parse_tool_calls(content, self.tool_format)
            calls = [
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for c in parsed
                if c.error is None
            ]
            if calls:  # the text around the calls is the message's content
                content = strip_tool_calls(content, self.tool_format).strip()
                finish = "tool_calls"
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = calls
        else:
            message["content"] = content
        return {
            "tokens": tokens, "log_probs": log_probs, "version": sample.version,
            "finish_reason": finish, "content": content, "said": said, "message": message,
        }  # fmt: skip

    def _tokens_to(self, tokens: np.ndarray, stops: list[str]) -> int:
        """The fewest leading tokens whose text holds a stop string."""
        low, high = 1, len(tokens)
        while low < high:
            middle = (low + high) // 2
            (text,) = self.codec.decode_many([tokens[:middle]], skip_special_tokens=False)
            if any(stop in text for stop in stops):
                high = middle
            else:
                low = middle + 1
        return low

    def _log_probs_json(self, choice: dict, chat: bool) -> dict[str, Any] | None:
        tokens, values = choice["tokens"], choice["log_probs"]
        if values is None:
            raise RuntimeError("the sampler returns no log-probs (return_log_probs=False)")
        pieces = self.codec.decode_many([[t] for t in tokens], skip_special_tokens=False)
        if chat:
            content = [
                {"token": piece, "logprob": float(v), "bytes": list(piece.encode()),
                 "top_logprobs": []}
                for piece, v in zip(pieces, values, strict=True)
            ]  # fmt: skip
            return {"content": content, "refusal": None}
        offsets = np.cumsum([0] + [len(p) for p in pieces[:-1]]).tolist() if pieces else []
        return {
            "tokens": pieces, "token_logprobs": [float(v) for v in values],
            "top_logprobs": None, "text_offset": offsets,
        }  # fmt: skip


@dataclass(frozen=True)
class _Prompt:
    tokens: np.ndarray
    mask: np.ndarray


def _bearer(request: Any) -> str | None:
    value = request.headers.get("authorization", "")
    token = value[7:].strip() if value.lower().startswith("bearer ") else ""
    return token or None


def _call_json(call: Call) -> dict[str, Any]:
    return {
        "index": call.index, "parent": call.parent, "endpoint": call.endpoint,
        "prompt_ids": call.prompt_ids.tolist(), "prompt_mask": call.prompt_mask.tolist(),
        "token_ids": call.tokens.tolist(),
        "log_probs": None if call.log_probs is None else call.log_probs.tolist(),
        "version": call.version, "finish_reason": call.finish_reason, "text": call.text,
    }  # fmt: skip
