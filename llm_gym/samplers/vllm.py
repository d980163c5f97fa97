"""``VLLMSampler``: vLLM in a process of its own, started and stopped by llm_gym, sampled over
HTTP as an ``OpenAISampler``; ``VLLMServer`` is the process.

vLLM's CPU build pins its own torch and transformers, so it lives in an environment of its
own (``bash scripts/setup_vllm.sh`` makes ``.venv-vllm``); llm_gym finds its interpreter in
``python=``, else ``$LLM_GYM_VLLM_PYTHON``, else ``./.venv-vllm/bin/python``. The server
listens on the loopback address only. On the CPU llm_gym sets vLLM's known settings, each
overridable through ``env=`` or the environment: ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache,
default 1), ``VLLM_CPU_OMP_THREADS_BIND`` (default: every core this process may use; vLLM's
own default binds one), ``VLLM_USE_AOT_COMPILE=0`` (no compile cache), and
``--enforce-eager``.

A server that does not come up within ``startup_timeout``, dies, or answers garbage is a
one-line ``SamplerError``, and no process is left behind: the server runs in a session of its
own, is killed with it on ``close()``, at exit, and by the kernel if this process dies.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llm_gym.checks import check_choice, check_number
from llm_gym.lm.loading import model_folder
from llm_gym.samplers.openai import OpenAISampler, SamplerError

__all__ = ["SERVED_NAME", "VLLMSampler", "VLLMServer", "find_vllm_python"]

SERVED_NAME = "llm_gym"  # the model's name on the server llm_gym starts
VLLM_DTYPES = ("auto", "float32", "bfloat16", "float16")
CPU_SETTINGS = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_USE_AOT_COMPILE": "0"}


def find_vllm_python(python: str | os.PathLike[str] | None = None) -> Path:
    """The interpreter of vLLM's environment: ``python``, else ``$LLM_GYM_VLLM_PYTHON``, else
    ``./.venv-vllm/bin/python``; a one-line error saying how to make one if there is none."""
    given = python or os.environ.get("LLM_GYM_VLLM_PYTHON")
    path = Path(given or ".venv-vllm/bin/python").expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        source = "python=" if python else "LLM_GYM_VLLM_PYTHON" if given else "the default"
        raise FileNotFoundError(
            f"no vLLM environment at {path} ({source}): run `bash scripts/setup_vllm.sh`, then "
            "pass --vllm-python PATH or set LLM_GYM_VLLM_PYTHON to its bin/python"
        )
    return path.absolute()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # Runs in the child before exec: its own session (so close() reaches vLLM's workers too)
    # and SIGTERM from the kernel when this process dies, however it dies.
    os.setsid()
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop(process: subprocess.Popen, log: Any) -> None:
    # The whole session: the API server and vLLM's engine process.
    if process.poll() is None:
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
    try:  # workers outliving the API server's exit
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    log.close()


class VLLMServer:
    """vLLM's OpenAI-compatible server for ``model`` (an HF folder) in a child process; up and
    answering ``/health`` when the constructor returns.

    Args:
        model: the model's folder (``llm_gym.lm.loading.model_folder("default")`` for the default).
        dtype: the weights' dtype on the server (``"float32"``, ``"bfloat16"``, ...).
        device: ``"cpu"`` (vLLM's CPU build) or ``"cuda"``/``"cuda:N"`` (a GPU build).
        engine_args: more of vLLM's engine options, ``{"max_model_len": 2048}`` becoming
            ``--max-model-len 2048`` (True: a bare flag).
        python: vLLM's interpreter (see ``find_vllm_python``).
        env: environment variables for the server, over llm_gym's CPU settings.
        startup_timeout: seconds to wait for ``/health`` before giving up.
        log_path: where the server's output goes (default: a temporary file).
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        dtype: str = "float32",
        device: str = "cpu",
        engine_args: Mapping[str, Any] | None = None,
        python: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 300.0,
        log_path: str | os.PathLike[str] | None = None,
    ) -> None:
        check_choice("dtype", dtype, VLLM_DTYPES)
        self.startup_timeout = check_number("startup_timeout", startup_timeout, 0, strict=True)
        if not (Path(model) / "config.json").is_file():
            raise FileNotFoundError(
                f"model {str(model)!r} is not a model folder (no config.json): vLLM serves a "
                "folder saved with save_pretrained"
            )
        if device != "cpu" and not str(device).startswith("cuda"):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
        self.python, self.port = find_vllm_python(python), _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [
            str(self.python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(Path(model).absolute()), "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(self.port), "--dtype", dtype,
            "--generation-config", "vllm",  # sampling settings come from llm_gym, not the folder
        ]  # fmt: skip
        environment = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "1"}
        environment |= {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        if device == "cpu":
            # No graph capture on the CPU; and no prefill split over steps: vLLM 0.32's CPU
            # runner fails seeded requests whose prompt is split ("CPU Generator does not use
            # offset"), which happens as soon as a batch's prompts pass 2048 tokens.
            command += ["--enforce-eager", "--no-enable-chunked-prefill"]
            cores = sorted(os.sched_getaffinity(0))
            defaults = CPU_SETTINGS | {"VLLM_CPU_OMP_THREADS_BIND": f"{cores[0]}-{cores[-1]}"}
            if cores != list(range(cores[0], cores[-1] + 1)):
                defaults["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
            environment = defaults | environment | {"CUDA_VISIBLE_DEVICES": ""}
        elif ":" in str(device):
            environment["CUDA_VISIBLE_DEVICES"] = str(device).split(":", 1)[1]
        for key, value in (engine_args or {}).items():
            flag = "--" + str(key).replace("_", "-")
            if value is True:
                command.append(flag)
            elif value is not False and value is not None:
                command += [flag, str(value)]
        environment |= dict(env or {})
        if log_path is None:
            log_path = tempfile.mkstemp(prefix="llm_gym-vllm-", suffix=".log")[1]
        self.log_path, self.command = Path(log_path), command
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        started = time.monotonic()
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=environment, preexec_fn=_die_with_parent,
        )  # fmt: skip
        self._finalizer = weakref.finalize(self, _stop, self.process, log)
        try:
            self._wait_healthy()
        except BaseException:  # Ctrl-C while waiting included: no server left behind
            self.close()
            raise
        self.startup_seconds = time.monotonic() - started

    def __repr__(self) -> str:
        state = "running" if self.alive else f"exited ({self.process.returncode})"
        return f"VLLMServer({self.url}, pid={self.process.pid}, {state})"

    @property
    def alive(self) -> bool:
        """Whether the server process is still running."""
        return self.process.poll() is None

    def close(self) -> None:
        """Stop the server and every process it started (idempotent)."""
        self._finalizer()

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def last_log_line(self) -> str:
        """The server's last non-empty output line (why it stopped, usually)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        lines = [line.strip() for line in lines if line.strip()]
        return lines[-1][:300] if lines else ""

    def died(self) -> SamplerError:
        """The error for a server that has exited."""
        return SamplerError(
            f"the vLLM server (pid {self.process.pid}) exited with code "
            f"{self.process.returncode}: {self.last_log_line()!r}; its log: {self.log_path}"
        )

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if not self.alive:
                raise self.died()
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise SamplerError(
            f"the vLLM server did not answer {self.url}/health within {self.startup_timeout:.0f} "
            f"s (startup_timeout); its log: {self.log_path}"
        )


class VLLMSampler(OpenAISampler):
    """An ``OpenAISampler`` over a ``VLLMServer`` it starts (and stops on ``close()``, at the
    end of a ``with`` block, or at exit).

    Args:
        model: the model's folder, or ``"default"`` (the default model's cached folder).
        dtype / device / engine_args / python / env / startup_timeout / log_path: the
            server's (see ``VLLMServer``).
        **sampling: ``OpenAISampler``'s options (``max_new_tokens``, ``temperature``,
            ``seed``, ``num_samples``, ``return_log_probs``, ``vocab_size``, ``timeout``).

    ``update_weights(folder)`` loads new weights into the running server (a folder of
    safetensors such as a training checkpoint): what ``llm-gym train --backend vllm`` does
    after every update. ``with_settings`` (``OpenAISampler``'s) gives a sampler of the same
    server: close only this one, the server's owner.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = "default",
        *,
        dtype: str = "float32",
        device: str = "cpu",
        engine_args: Mapping[str, Any] | None = None,
        python: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 300.0,
        log_path: str | os.PathLike[str] | None = None,
        **sampling: float | str | None,
    ) -> None:
        self.server = VLLMServer(
            model_folder(model), dtype=dtype, device=device, engine_args=engine_args,
            python=python, env=env, startup_timeout=startup_timeout, log_path=log_path,
        )  # fmt: skip
        try:
            super().__init__(self.server.url, SERVED_NAME, **sampling)
        except BaseException:
            self.server.close()
            raise

    def close(self) -> None:
        """Stop the server."""
        self.server.close()

    def _unreachable(self, error: Exception) -> SamplerError:
        try:  # a dropped connection comes a moment before the server's exit
            self.server.process.wait(2)
        except subprocess.TimeoutExpired:
            pass
        if not self.server.alive:
            return self.server.died()
        return super()._unreachable(error)
