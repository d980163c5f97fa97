"""Every ```python block of README.md runs as written (issue 27, finding 12).

Each block runs alone, in a fresh namespace, from the repository root (what README's "Quick
look" tells a user), with ``LLM_GYM_GSM8K_PATH`` set as README's "Tools" tells a user to set it
offline. Values the blocks state are ``assert`` lines in README itself, so a block whose
comments drift from what it does fails here.
"""

import linecache
import os
import re
from pathlib import Path

import pytest
from conftest import GSM8K_PATH

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def readme_blocks() -> list[tuple[int, str]]:
    """README's python blocks, in order, with the line each starts on."""
    text = README.read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


BLOCKS = readme_blocks()


def test_readme_has_its_blocks():
    # Quick look (2), Tasks, Games, Tools, adding a task, make_vec, Policies, backends, KL, SB3,
    # TRL (2).
    assert len(BLOCKS) == 14
    assert all(code.strip() for _, code in BLOCKS)


def test_readme_tells_gsm8k_users_the_variable_before_the_first_gsm8k_block():
    text = README.read_text()
    first = min(text.index(code) for _, code in BLOCKS if "GSM8K" in code)
    assert "export LLM_GYM_GSM8K_PATH=" in text[:first]


@pytest.fixture
def one_thread():
    """One torch thread while a block runs: on this project's shared 2-core machine torch's
    default (a thread per core) is many times slower when another process holds a core."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(
    "line, code",
    [
        # A block that starts a vLLM server needs its environment (scripts/setup_vllm.sh).
        pytest.param(line, code, marks=[pytest.mark.vllm] if "VLLMSampler" in code else [])
        for line, code in BLOCKS
    ],
    ids=[f"line{line}" for line, _ in BLOCKS],
)
def test_readme_block_runs(line, code, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("LLM_GYM_GSM8K_PATH", str(GSM8K_PATH))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = set(os.listdir(ROOT))
    name = f"README.md:{line}"
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)  # for tracebacks
    exec(compile(code, name, "exec"), {"__name__": "__readme__"})
    assert set(os.listdir(ROOT)) == before, "README blocks write into a temporary folder"
