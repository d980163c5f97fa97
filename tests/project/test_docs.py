"""README.md and the documentation site in docs/ (issue 38).

Every ```python block of README.md and docs/**/*.md runs as written (issue 27, finding 12):
each block runs alone, in a fresh namespace, from the repository root (what the Quick look
tells a user), with ``LLM_GYM_GSM8K_PATH`` set as the pages tell a user to set it offline.
Values the blocks state are ``assert`` lines in the pages themselves, so a block whose
comments drift from what it does fails here. A block that is not meant to run takes another
fence language (```bash, ```text).

The site builds with ``mkdocs build --strict`` (no broken link, no missing reference, no
docstring warning), its command-line page is generated from the parser, and its API pages
name every public name.
"""

import argparse
import importlib
import importlib.util
import linecache
import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from conftest import GSM8K_PATH

# Registered before any block runs: a block's cleanup removes only the ids the block itself
# registered, so the package's own ids must not be counted as the first importing block's.
import llm_gym

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
# The packages whose every public name (``__all__``) the API reference renders.
PUBLIC = [
    "llm_gym.envs",
    "llm_gym.wrappers",
    "llm_gym.policies",
    "llm_gym.samplers",
    "llm_gym.tasks",
    "llm_gym.rubrics",
    "llm_gym.rewards",
    "llm_gym.sources",
    "llm_gym.chat",
    "llm_gym.tools",
    "llm_gym.games",
    "llm_gym.lm",
    "llm_gym.episodes",
    "llm_gym.torchrl",
    "llm_gym.run",
    "llm_gym.train",
    "llm_gym.integrations.trl",
    "llm_gym.integrations.openenv_server",
    "llm_gym.integrations.verifiers",
    "llm_gym.spaces",
    "llm_gym.checks",
]


def python_blocks(page: Path) -> list[tuple[int, str]]:
    """The page's python blocks, in order, with the line each starts on."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


BLOCKS = [
    (page.relative_to(ROOT).as_posix(), line, code)
    for page in PAGES
    for line, code in python_blocks(page)
]


def load_docs_module(name: str):
    """``docs/<name>.py`` (the MkDocs hook, the griffe extension), imported by path."""
    spec = importlib.util.spec_from_file_location(f"_docs_{name}", DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_is_a_first_read():
    text = README.read_text()
    assert len(text) <= 12_000
    first_screen = "\n".join(text.splitlines()[:40])
    assert (
        "bash scripts/setup.sh && .venv/bin/llm-gym train --env-arg task=chain_sum "
        "--eval-episodes 128 --save-every 20 --save-dtype bfloat16 --out runs/demo --overwrite"
        in first_screen
    )
    assert "bash scripts/setup.sh --vllm && .venv/bin/python -m pytest -q" in first_screen
    assert len(python_blocks(README)) == 4  # the Quick look and the agent


def test_readme_links_to_pages_that_exist():
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", README.read_text())
    assert links
    assert [link for link in links if not (ROOT / link).is_file()] == []


def test_every_page_has_its_blocks():
    counts = {page: n for page in PAGES if (n := len(python_blocks(page)))}
    assert sum(counts.values()) == len(BLOCKS) >= 17
    assert all(code.strip() for _, _, code in BLOCKS)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_pages_tell_gsm8k_users_the_variable_before_their_first_gsm8k_block(page):
    text = page.read_text()
    gsm8k = [text.index(code) for _, code in python_blocks(page) if "GSM8K" in code]
    if gsm8k:
        assert "export LLM_GYM_GSM8K_PATH=" in text[: min(gsm8k)]


@pytest.fixture
def one_thread():
    """One torch thread while a block runs: on this project's shared 2-core machine torch's
    default (a thread per core) is many times slower when another process holds a core."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def block_marks(code: str) -> list[pytest.MarkDecorator]:
    """A block that starts a vLLM server needs its environment (scripts/setup_vllm.sh); one
    that trains through TRL or stable-baselines3 takes 15-30 s."""
    marks = [pytest.mark.vllm] if "VLLMSampler" in code else []
    if "from trl import" in code or "from stable_baselines3 import PPO" in code:
        marks.append(pytest.mark.slow)
    return marks


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(
    "page, line, code",
    [pytest.param(*block, marks=block_marks(block[2])) for block in BLOCKS],
    ids=[f"{page}:{line}" for page, line, _ in BLOCKS],
)
def test_block_runs(page, line, code, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("LLM_GYM_GSM8K_PATH", str(GSM8K_PATH))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = set(os.listdir(ROOT))
    registered = set(gym.registry)
    name = f"{page}:{line}"
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)  # for tracebacks
    try:
        exec(compile(code, name, "exec"), {"__name__": "__docs__"})
    finally:  # an id a block registers (docs/envs/chat.md's) is the block's, not the suite's
        for env_id in set(gym.registry) - registered:
            del gym.registry[env_id]
    assert set(os.listdir(ROOT)) - before == set(), "the blocks write into a temporary folder"


def test_cli_page_is_the_parsers_help_for_every_command():
    from llm_gym.cli import build_parser

    hooks = load_docs_module("hooks")
    assert hooks.MARKER in (DOCS / hooks.PAGE).read_text()
    reference = hooks.cli_reference()
    parser = build_parser()
    parsers = [parser, *hooks.subcommands(parser)]
    assert {p.prog for p in parsers} >= {
        "llm-gym",
        *(f"llm-gym {c}" for c in ("rollout", "train", "envs")),
    }
    for p in parsers:
        assert f"### `{p.prog}`" in reference
        flags = [s for a in p._actions for s in a.option_strings if s.startswith("--")]
        assert [flag for flag in flags if flag not in reference] == [], p.prog
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                assert all(f"llm-gym {command}" in reference for command in action.choices)


def test_docstring_examples_become_fenced_blocks():
    extension = load_docs_module("griffe_doctest")
    text = "Sums.\n\n    >>> 1 + 1\n    2\n\nDone."
    fenced = "Sums.\n\n    ```pycon\n    >>> 1 + 1\n    2\n    ```\n\nDone."
    assert extension.fence_doctests(text) == fenced
    text = "Start it::\n\n    import llm_gym\n      nested\n\nDone."
    fenced = "Start it:\n\n```python\nimport llm_gym\n  nested\n```\n\nDone."
    assert extension.fence_literals(text) == fenced
    for plain in ("No examples.", "Ends with::", "::\n\n    x"):
        assert extension.fence_doctests(plain) == extension.fence_literals(plain) == plain


def test_site_builds_strict_and_names_every_public_name(tmp_path):
    pytest.importorskip("mkdocs")
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    anchors = set()
    for page in site.rglob("*.html"):
        anchors |= set(re.findall(r'id="(llm_gym[\w.]*)"', page.read_text()))
    missing = []
    for package in PUBLIC:
        for name in importlib.import_module(package).__all__:
            # Rendered under the package, or under the module that defines a lazy export.
            if f"{package}.{name}" not in anchors and not any(
                a.startswith(f"{package}.") and a.endswith(f".{name}") for a in anchors
            ):
                missing.append(f"{package}.{name}")
    assert missing == []

    api_index = (DOCS / "api" / "index.md").read_text()
    assert [name for name in llm_gym.__all__ if f"`{name}`" not in api_index] == []
