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

import asyncio
import json
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

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
from llm_gym.chat.conversation import Conversation, PromptBuilder
from llm_gym.chat.history import History
from llm_gym.checks import check_choice, check_int
from llm_gym.samplers.base import Sample, Sampler, SamplingSettings, check_sampler
from llm_gym.samplers.batching import Batched, BatchingSampler
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

__all__ = ["EPISODE_HEADER", "MAX_BODY_BYTES", "Gateway", "context_length"]

EPISODE_HEADER = "x-episode-id"
MAX_BODY_BYTES = 8 * 2**20  # a request body's bytes at most (8 MiB)
_DRAIN_BYTES = 64 * 2**20  # of a body too large, read and dropped so that its 413 arrives
_POLL = 0.25  # seconds between looks at whether a waiting request's client hung up


def context_length(sampler: object, tokenizer: object = None) -> int | None:
    """The positions the sampler's model has (a prompt and its reply together), from its
    transformers config (``max_position_embeddings``, ``n_positions``), a vLLM sampler's
    ``max_model_len``, else the tokenizer's ``model_max_length`` when it is a real one;
    None when unknown.

    >>> context_length(object()) is None
    True
    """
    for owner in (sampler, getattr(sampler, "sampler", None)):
        config = getattr(getattr(owner, "model", None), "config", None)
        for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
            value = getattr(config, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        value = getattr(owner, "max_model_len", None)
        if isinstance(value, int) and value > 0:
            return value
    value = getattr(tokenizer, "model_max_length", None)
    return value if isinstance(value, int) and 0 < value < 10**7 else None  # else a sentinel


_context_of = context_length  # Gateway's argument of that name hides the function


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
            context_length = _context_of(sampler, tokenizer)
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
        self._budget = _default_budget(sampler)
        self._token_bytes = _max_token_bytes(tokenizer)
        self.cancelled = 0
        self._server: ThreadedServer | None = None
        self.url: str | None = None
        self.app = self._make_app()

    def __repr__(self) -> str:
        return f"Gateway({self.sampler!r}, model_name={self.model_name!r}, url={self.url!r})"

    # -- serving -----------------------------------------------------------------------------

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

    # -- sampling: requests in flight batched -----------------------------------------------

    async def _sample(
        self, request: Any, prompt: np.ndarray, n: int, settings: SamplingSettings,
        budget: int | None, stops: list[str],
    ) -> tuple[list[Sample], float, float] | None:  # fmt: skip
        """The ``n`` samples of ``prompt`` (at most ``budget`` tokens each) and the seconds
        they queued and were sampled; None when the client hung up first. Sampled
        ``chunk_tokens`` at a time: each chunk is a call of its own, queued behind the calls
        waiting, its prompt the prompt and the tokens so far (as sampled, never re-tokenized),
        its seed (if any) derived from the request's and the chunk's number. Every chunk asks
        for ``chunk_tokens`` (the last one's tail past ``budget`` dropped), so that the
        chunks of requests at different points share a batch."""
        chunked = (
            self.chunk_tokens is not None and budget is not None and budget > self.chunk_tokens
            and self.batching.configurable and (self.batching.num_samples or 1) == 1
        )  # fmt: skip
        if not chunked:
            if budget is not None and self.batching.configurable:
                settings = replace(settings, max_new_tokens=budget)
            batched = await self._wait(request, self.batching.submit([prompt] * n, settings))
            return None if batched is None else (batched.samples, batched.queued, batched.seconds)
        tokens: list[list[np.ndarray]] = [[] for _ in range(n)]
        log_probs: list[list[np.ndarray] | None] = [[] for _ in range(n)]
        versions: list[list[int | None]] = [[] for _ in range(n)]
        finish, active, done, step = ["length"] * n, list(range(n)), 0, 0
        queued = seconds = 0.0
        while active:
            keep = min(self.chunk_tokens, budget - done)
            seed = settings.seed
            if seed is not None and step:  # the first chunk keeps the request's own seed
                seed = int(np.random.SeedSequence([seed, step]).generate_state(1)[0])
            size = self.chunk_tokens  # past the context only near its end: then what is left
            if self.context_length is not None:
                size = min(size, self.context_length - len(prompt) - done)
            chunk = replace(settings, max_new_tokens=size, seed=seed)
            prompts = [np.concatenate([prompt, *tokens[i]]) for i in active]
            batched = await self._wait(request, self.batching.submit(prompts, chunk))
            if batched is None:
                return None
            queued, seconds = queued + batched.queued, seconds + batched.seconds
            done, step, still = done + keep, step + 1, []
            for i, sample in zip(active, batched.samples, strict=True):
                tokens[i].append(np.asarray(sample.tokens[:keep], np.int64))
                versions[i].append(sample.version)
                if sample.log_probs is None:
                    log_probs[i] = None
                elif log_probs[i] is not None:
                    log_probs[i].append(sample.log_probs[:keep])
                if sample.finish_reason == "stop" and len(sample.tokens) <= keep:
                    finish[i] = "stop"
                elif done < budget and not self._says_stop(tokens[i], stops):
                    still.append(i)
            active = still
        samples = []
        for i in range(n):
            ids = np.concatenate(tokens[i]) if tokens[i] else np.zeros(0, np.int64)
            values = None if log_probs[i] is None else np.concatenate(log_probs[i])
            known = [v for v in versions[i] if v is not None]
            # The oldest policy that sampled any of its tokens (a weight update may come
            # between chunks).
            samples.append(Sample(ids, values, finish[i], min(known) if known else None))
        return samples, queued, seconds

    def _says_stop(self, tokens: list[np.ndarray], stops: list[str]) -> bool:
        if not stops:
            return False
        (text,) = self.codec.decode_many([np.concatenate(tokens)], skip_special_tokens=False)
        return any(stop in text for stop in stops)

    async def _wait(self, request: Any, future: Any) -> Batched | None:
        """What ``future`` gives, or None as soon as ``request``'s client hangs up (the call
        is cancelled if not begun: a batch leaves it out; a begun one is left to finish)."""
        waiting = asyncio.wrap_future(future)
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=_POLL)
            if done:
                return waiting.result()
            if await request.is_disconnected():
                future.cancel()
                waiting.add_done_callback(_retrieve)
                self.cancelled += 1
                return None

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
        self._check_size(body)
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
        budget = self._budget_of(prompt.tokens, body.settings.max_new_tokens, chat)
        stops = list(body.stops)
        sampled = await self._sample(request, prompt.tokens, body.n, body.settings, budget, stops)
        if sampled is None or await request.is_disconnected():  # nobody to answer: no record
            if sampled is not None:
                self.cancelled += 1
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

    # -- limits ------------------------------------------------------------------------------

    def _too_long(self, tokens: str, chat: bool) -> BadRequest:
        what = "messages" if chat else "prompt"
        return BadRequest(
            f"This model's maximum context length is {self.context_length} tokens. However, "
            f"your {what} resulted in {tokens} tokens. Please reduce the length of the {what}.",
            what, 400, "context_length_exceeded",
        )  # fmt: skip

    def _check_size(self, body: Request) -> None:
        """A ``context_length_exceeded`` for text too long to fit, before it is tokenized
        (a 5 MB message took the tokenizer seconds and the sampler all the memory): no token
        holds more than ``_token_bytes`` of UTF-8 (halved again for normalizers)."""
        if self.context_length is None or self._token_bytes is None:
            return
        if body.chat:
            size = sum(_text_bytes(m.get("content")) for m in body.messages)
        elif isinstance(body.prompt, str):
            size = len(body.prompt.encode())
        else:
            return
        least = size // (2 * self._token_bytes)
        if least >= self.context_length:
            raise self._too_long(f"at least {least}", body.chat)

    def _budget_of(self, prompt: np.ndarray, requested: int | None, chat: bool) -> int | None:
        """The tokens a reply may have: those asked for (else the sampler's own), at most
        the context less the prompt; a ``context_length_exceeded`` for a prompt that leaves
        no room."""
        room = None
        if self.context_length is not None:
            room = self.context_length - len(prompt)
            if room < 1:
                raise self._too_long(str(len(prompt)), chat)
        budget = requested if requested is not None else self._budget
        if budget is None or room is None:
            return budget
        return min(budget, room)

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


def _retrieve(future: asyncio.Future) -> None:
    """Take an abandoned call's outcome, so that its error is not logged as never retrieved."""
    if not future.cancelled():
        future.exception()


def _text_bytes(content: object) -> int:
    if isinstance(content, str):
        return len(content.encode())
    if isinstance(content, list):
        return sum(_text_bytes(p.get("text")) for p in content if isinstance(p, Mapping))
    return 0


def _default_budget(sampler: object) -> int | None:
    """The reply tokens ``sampler`` gives when not told (its ``max_new_tokens``)."""
    for owner in (sampler, getattr(sampler, "sampler", None)):
        value = getattr(owner, "max_new_tokens", None)
        if value is None and isinstance(getattr(owner, "generate_kwargs", None), Mapping):
            value = owner.generate_kwargs.get("max_new_tokens")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _max_token_bytes(tokenizer: Any) -> int | None:
    """The most UTF-8 bytes one token's text holds (special tokens included); None if the
    tokenizer cannot list its tokens. A byte-level token's string has a character per byte,
    each at least a byte: its length bounds the bytes it stands for."""
    try:
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        return max(len(str(p).encode("utf-8", "surrogatepass")) for p in pieces if p) or None
    except Exception:  # a tokenizer of another kind: no bound, every prompt is tokenized
        return None
