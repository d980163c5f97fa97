"""``llm-gym check-template`` (issue 62): whether a chat template keeps earlier turns' tokens
when a turn is added, said before training, as the env finds it during training."""

import subprocess
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from llm_gym.chat import TokenPrefixError
from llm_gym.chat.prefix_check import check_prefix
from llm_gym.cli import main
from llm_gym.envs import EnvResponse, SessionChatEnv
from llm_gym.lm.loading import model_folder

# Mistral's v3 way: the system prompt goes into the last user message, so the first prompt's
# tokens change once a second user message comes.
SYSTEM_LAST = (
    "{%- set system = messages | selectattr('role', 'eq', 'system') | list -%}"
    "{%- set chat = messages | rejectattr('role', 'eq', 'system') | list -%}"
    "{%- set last = chat | selectattr('role', 'eq', 'user') | list | last -%}"
    "{%- for m in chat -%}"
    "{%- if m['role'] == 'user' -%}[INST]"
    "{%- if m is sameas last and system %}{{ system[0]['content'] }}\n\n{% endif -%}"
    "{{ m['content'] }}[/INST]"
    "{%- else %}{{ m['content'] }}<|im_end|>{% endif -%}"
    "{%- endfor -%}"
)
VLLM = Path(__file__).parents[2] / ".venv-vllm"


def vllm_templates():
    # The chat templates vLLM's package ships, wherever its environment put it.
    where = "import os, vllm; print(os.path.dirname(vllm.__file__))"
    done = subprocess.run([VLLM / "bin/python", "-c", where], capture_output=True, text=True)
    return Path(done.stdout.strip()) / "transformers_utils/chat_templates"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(model_folder("default"), local_files_only=True)


def test_the_default_models_template_keeps_earlier_turns(tokenizer, capsys):
    for system in (None, "You play games."):
        found = check_prefix(tokenizer, system_prompt=system)
        assert (found.keeps, found.turns, found.turn) == (True, 4, None)
    for name in ("qwen", "llama"):  # llm_gym's built-ins keep them too
        assert check_prefix(tokenizer, chat_template_name=name).keeps
    assert main(["check-template"]) == 0
    assert (
        capsys.readouterr().out == "default's template keeps earlier turns' tokens over 4 turns\n"
    )


def test_a_template_that_moves_the_system_prompt_is_caught_as_the_env_meets_it(
    tokenizer, tmp_path, capsys
):
    assert check_prefix(tokenizer, chat_template=SYSTEM_LAST).keeps  # no system prompt
    found = check_prefix(tokenizer, chat_template=SYSTEM_LAST, system_prompt="Be brief.")
    assert (found.keeps, found.turn) == (False, 1)
    assert "the conversation read '[INST]Be brief." in found.detail
    path = tmp_path / "system_last.jinja"
    path.write_text(SYSTEM_LAST)
    args = ["check-template", "--chat-template", str(path), "--system-prompt", "Be brief."]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{path} template changes earlier turns' tokens when turn 2 is added: ")

    # A training env with the template meets it at the first turn that is not the last.
    class Game(SessionChatEnv):
        def env_response(self, conversation, text, item):
            return EnvResponse("Again.", 0.0, False)

    env = Game(
        [{"query": "Guess."}], input_mode="tokens", tokenizer=tokenizer, max_turns=3,
        template_kwargs={"chat_template": SYSTEM_LAST}, system_prompt="Be brief.",
    )  # fmt: skip
    env.reset(seed=0)
    sampled = np.append(tokenizer("[10]", add_special_tokens=False)["input_ids"], 2)
    with pytest.raises(TokenPrefixError, match="turn 1: position"):
        env.step(sampled)


@pytest.mark.vllm
def test_templates_shipped_offline_that_break_and_keep(tokenizer, tmp_path):
    # vLLM's MiniCPM-V 4.5 template (Qwen3's way: an empty thinking block in the generation
    # prompt that the turn, once in the history, does not have); Mistral's v3 and v7
    # templates as mistral_common writes them.
    templates = vllm_templates()
    found = check_prefix(
        tokenizer, chat_template=(templates / "template_minicpmv45.jinja").read_text()
    )
    assert (found.keeps, found.turn) == (False, 1) and "<think>\\n\\n</think>" in found.detail
    assert check_prefix(
        tokenizer, chat_template=(templates / "template_chatml.jinja").read_text()
    ).keeps
    write = (
        "import sys\n"
        "from mistral_common.integrations.chat_templates.chat_templates import "
        "generate_chat_template\n"
        "from mistral_common.tokens.tokenizers.base import TokenizerVersion\n"
        "for v in ('v3', 'v7'):\n"
        "    t = generate_chat_template(spm=False, tokenizer_version=TokenizerVersion(v), "
        "image_support=False, audio_support=False, thinking_support=False, "
        "default_system_prompt=None, plain_thinking_support=False, "
        "use_special_token_variables=False, model_settings_fields=None, "
        "reasoning_effort_values=None, reasoning_effort_default=None)\n"
        "    open(f'{sys.argv[1]}/mistral_{v}.jinja', 'w').write(t)\n"
    )
    subprocess.run([VLLM / "bin/python", "-c", write, tmp_path], check=True)
    v3, v7 = ((tmp_path / f"mistral_{v}.jinja").read_text() for v in ("v3", "v7"))
    assert check_prefix(tokenizer, chat_template=v3).keeps
    broken = check_prefix(tokenizer, chat_template=v3, system_prompt="You play games.")
    assert (broken.keeps, broken.turn) == (False, 1)
    assert check_prefix(tokenizer, chat_template=v7, system_prompt="You play games.").keeps


def test_bad_arguments_are_one_line(tokenizer, capsys):
    cases = [
        (["--chat-template", "/no/such.jinja"], "--chat-template '/no/such.jinja' is neither"),
        (["--model", "/no/such/model"], "--model '/no/such/model' is not a folder"),
        (["--turns", "5"], "--turns must be 1 to 4"),
    ]
    for args, message in cases:
        assert main(["check-template", *args]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
    with pytest.raises(ValueError, match="turns must be 1 to 4, got 0"):
        check_prefix(tokenizer, turns=0)
