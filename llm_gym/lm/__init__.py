"""The language model: tensor work in torch alone (``tensors``: padding, positions, log-probs,
EOS lengths), padding-free packing (``packing``), the dtypes a device runs fast and autocast
(``precision``), and loading weights offline (``loading``: the default SmolLM2, GPT-2's BPE,
tiny random LMs). The loaders import transformers on first use."""

from llm_gym._lazy import lazy_exports
from llm_gym.lm import tensors
from llm_gym.lm.tensors import *  # noqa: F403  (every public name of tensors)

# Loaders: name -> module, imported on first use (transformers takes seconds to import).
_LOADERS = {
    name: "llm_gym.lm.loading"
    for name in (
        "DEFAULT_MODEL_NAME",
        "cache_root",
        "load_default_model",
        "load_gpt2_tokenizer",
        "load_model",
        "model_folder",
        "tiny_model",
    )
}

__all__ = [*tensors.__all__, *_LOADERS]

__getattr__ = lazy_exports(__name__, _LOADERS)
