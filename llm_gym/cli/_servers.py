"""The commands that serve until stopped: ``llm-gym serve`` (an env over OpenEnv's protocol)
and ``llm-gym gateway`` (an OpenAI-compatible server that records agents' calls)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import gymnasium as gym

from llm_gym.cli._args import llm_gym_env_ids, usage_error
from llm_gym.options import env_arg, number
from llm_gym.run.config import BACKENDS, DTYPE_CHOICES, RolloutConfig

__all__ = ["add_gateway", "add_serve", "gateway", "serve"]


def add_serve(commands: Any) -> None:
    """``llm-gym serve``'s parser."""
    parser = commands.add_parser(
        "serve",
        help="serve an env over OpenEnv's protocol: one env per WebSocket session",
        description="Serve a registered env id with OpenEnv's own server (create_app): one "
        "env per WebSocket session at /ws, /health, /schema, /metadata, /state. An action is "
        '{"text": ...} or {"tokens": [...]}; an observation holds the env\'s observation '
        "keys, terminated, truncated and the step's info. Needs the 'serve' extra.",
    )
    add = parser.add_argument
    add("env", metavar="ENV_ID", help="a registered env id (llm-gym envs lists them)")
    add("--env-arg", action="append", default=[], type=env_arg, metavar="KEY=VALUE",
        help="an argument of gym.make, repeatable; VALUE is read as JSON when it "
        "parses (default: %(default)s, the env's defaults)")  # fmt: skip
    add("--tokenizer", default=None, metavar="MODEL",
        help="the tokenizer of this model ('default' or a folder) for text and tokens input "
        "modes (--env-arg input_mode=tokens; default: %(default)s, history mode only)")  # fmt: skip
    add("--host", default="127.0.0.1", help="the address to bind (default: %(default)s)")
    add("--port", type=number(int, 0), default=8000,
        help="the port (default: %(default)s; 0: a free one)")  # fmt: skip
    add("--max-sessions", type=number(int, 1), default=64,
        help="WebSocket sessions at once; one more gets CAPACITY_REACHED (default: "
        "%(default)s)")  # fmt: skip
    add("--session-timeout", type=number(float, 0.0, False), default=None, metavar="SECONDS",
        help="close a session idle this long (default: %(default)s, never)")  # fmt: skip
    add("--max-message-bytes", type=number(int, 1), default=1 << 20,
        help="the largest action a client may send; a larger one is refused, not buffered "
        "(default: %(default)s)")  # fmt: skip
    add("--ping-interval", type=number(float, 0.0, False), default=10.0, metavar="SECONDS",
        help="WebSocket pings; a client silent for two intervals is dropped and its slot "
        "freed (default: %(default)s)")  # fmt: skip
    add("--step-timeout", type=number(float, 0.0, False), default=60.0, metavar="SECONDS",
        help="the longest a reset or step may take, tools included; one over is an error "
        "reply, its env is discarded and its session closed (default: %(default)s)")  # fmt: skip
    add("--reveal-answers", action="store_true",
        help="send the info keys that hold the reference (answer, solution, "
        "canonical_solution, test, metadata): kept on the server by default, as the client "
        "may be the agent under evaluation (default: %(default)s)")  # fmt: skip
    add("--api-key", default=None, metavar="KEY",
        help="refuse callers without this key (Authorization: Bearer KEY, X-API-Key: KEY or "
        "?api_key=KEY; /health stays open; default: %(default)s, $LLM_GYM_API_KEY, else "
        "none)")  # fmt: skip
    add("--web", action="store_true",
        help="OpenEnv's web interface at /web, to play the env by hand in a browser, one "
        "env per browser session within --max-sessions (default: %(default)s)")  # fmt: skip


def serve(args: argparse.Namespace) -> int:
    """Serve ``args.env`` until Ctrl-C; the exit code."""
    if args.env not in llm_gym_env_ids():
        return usage_error(f"{args.env!r} is not a registered llm_gym env id (llm-gym envs)")
    env_args = dict(args.env_arg)
    from llm_gym.servers import exposure_warning

    api_key = args.api_key or os.environ.get("LLM_GYM_API_KEY") or None
    try:
        from llm_gym.integrations.openenv_server import Server

        if args.tokenizer is not None:  # the model's tokenizer, as rollout and train load it
            from llm_gym.lm.loading import load_model

            env_args["tokenizer"] = load_model(args.tokenizer)[1]
        server = Server(
            args.env, env_args, host=args.host, port=args.port,
            max_sessions=args.max_sessions, session_timeout=args.session_timeout,
            max_message_bytes=args.max_message_bytes, ping_interval=args.ping_interval,
            step_timeout=args.step_timeout, reveal_answers=args.reveal_answers,
            api_key=api_key, web=args.web,
        )  # fmt: skip
        url = server.start()
    except (ValueError, TypeError, OSError, ImportError, gym.error.Error) as error:
        return usage_error(error)
    # before the URL's line: whoever reads that line has had the warning
    if (warning := exposure_warning(args.host, api_key)) is not None:
        print(warning, file=sys.stderr, flush=True)
    print(f"serving {args.env} at {url} (OpenEnv: ws{url.removeprefix('http')}/ws"
          f"{f'; by hand: {url}/web' if args.web else ''})", flush=True)  # fmt: skip
    try:
        server.wait()
    except KeyboardInterrupt:
        server.stop()
        return 130
    return 0


def add_gateway(commands: Any) -> None:
    """``llm-gym gateway``'s parser."""
    parser = commands.add_parser(
        "gateway",
        help="serve a model over the OpenAI API, recording each episode's calls token for token",
        description="An OpenAI-compatible server (/v1/models, /v1/chat/completions, "
        "/v1/completions; streaming, n, temperature, max_tokens, stop, seed, logprobs, tools) "
        "in front of a model and backend. A request names its episode with the X-Episode-Id "
        "header or its API key, and the episode is that key's alone; GET /v1/episodes/NAME "
        "(with the key) returns the episode's calls: prompt and sampled token ids, log-probs, "
        "policy version (docs/agents.md).",
    )
    add, defaults = parser.add_argument, RolloutConfig()
    add("--model", default=defaults.model, help="'default' (SmolLM2-135M-Instruct) or a folder")
    add("--model-name", default="policy",
        help="the model's name in the API, which requests name (default: %(default)s)")  # fmt: skip
    add("--max-new-tokens", type=number(int, 1), default=defaults.max_new_tokens,
        help="tokens per reply unless a request says (default: %(default)s)")  # fmt: skip
    add("--temperature", type=number(float, 0.0), default=1.0,
        help="sampling temperature when a request gives none (default: %(default)s)")  # fmt: skip
    add("--backend", choices=BACKENDS, default=defaults.backend,
        help="what generates: transformers here, a vLLM server llm_gym starts, or an "
        "OpenAI-compatible server at --base-url that returns token ids")  # fmt: skip
    add("--base-url", default=None, metavar="URL", help="--backend openai: the server")
    add("--served-model", default=None, metavar="NAME",
        help="--backend openai: the model's name there (default: %(default)s, its only "
        "one)")  # fmt: skip
    add("--backend-arg", action="append", default=[], type=env_arg, metavar="KEY=VALUE",
        help="--backend vllm: a vLLM engine option, repeatable")  # fmt: skip
    add("--vllm-python", default=None, metavar="PATH",
        help="--backend vllm: the vLLM environment's python")  # fmt: skip
    add("--device", default=defaults.device, help="'auto', 'cpu', 'cuda' or 'cuda:N'")
    add("--dtype", choices=DTYPE_CHOICES, default=defaults.dtype,
        help="the model's dtype ('auto': bfloat16 where the device runs it fast, else "
        "float32; default: %(default)s)")  # fmt: skip
    add("--seed", type=number(int, 0), default=defaults.seed, help="seeds the sampling")
    add("--threads", type=number(int, 1), default=None, help="torch CPU threads")
    add("--host", default="127.0.0.1", help="the address to bind (default: %(default)s)")
    add("--port", type=number(int, 0), default=8000,
        help="the port (default: %(default)s; 0: a free one)")  # fmt: skip
    add("--out", default="runs/gateway", help="where a vLLM server's log goes")
    add("--api-key", default=None, metavar="KEY",
        help="callers must send this bearer token (else a 401); its holder reads every "
        "episode. Without it any key is accepted, each owning the episodes it opens")  # fmt: skip
    add("--max-body-bytes", type=number(int, 1), default=8 * 2**20, metavar="N",
        help="a request body's bytes at most, a 413 past it (default: %(default)s)")  # fmt: skip
    add("--episode-ttl", type=number(float, 0.0), default=3600.0, metavar="SECONDS",
        help="an episode is forgotten this long after its last call (0: kept until read "
        "with DELETE; default: %(default)s)")  # fmt: skip
    add("--max-episodes", type=number(int, 1), default=1024, metavar="N",
        help="episodes kept at most; past it the one called longest ago goes "
        "(default: %(default)s)")  # fmt: skip
    add("--chunk-tokens", type=number(int, 1), default=16, metavar="N",
        help="tokens sampled per turn: requests in flight take turns, so a long reply delays "
        "others by one chunk (default: %(default)s)")  # fmt: skip


def gateway(args: argparse.Namespace) -> int:
    """Run the agent gateway until Ctrl-C; the exit code."""
    try:
        config = RolloutConfig(
            model=args.model, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
            backend=args.backend, base_url=args.base_url, served_model=args.served_model,
            backend_args=dict(args.backend_arg), vllm_python=args.vllm_python,
            device=args.device, dtype=args.dtype, seed=args.seed, out=args.out,
        )  # fmt: skip
    except (ValueError, TypeError) as error:
        return usage_error(error)
    import torch

    from llm_gym.agents import Gateway
    from llm_gym.lm.loading import load_model
    from llm_gym.run.setup import make_policy, resolve_device, resolve_dtype
    from llm_gym.samplers import SamplerError
    from llm_gym.servers import exposure_warning

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        model, tokenizer = load_model(config.model, device=device, dtype=dtype)
        policy = make_policy(model, tokenizer, config)
        sampler = getattr(policy, "sampler", policy)
        gateway = Gateway(
            sampler, tokenizer, model_name=args.model_name, api_key=args.api_key,
            max_body_bytes=args.max_body_bytes, episode_ttl=args.episode_ttl or None,
            max_episodes=args.max_episodes, chunk_tokens=args.chunk_tokens,
        )  # fmt: skip
        url = gateway.serve(args.host, args.port)
    except (ValueError, TypeError, OSError, ImportError, SamplerError) as error:
        return usage_error(error)
    warning = exposure_warning(args.host, args.api_key)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    print(f"serving {args.model_name!r} at {url}/v1 (OpenAI API; episodes: {url}/v1/episodes/"
          "NAME)", flush=True)  # fmt: skip
    try:
        gateway.wait()
    except KeyboardInterrupt:
        return 130
    finally:
        gateway.close()
        close = getattr(sampler, "close", None)
        if close is not None:
            close()
    return 0
