"""TRL's ``environment_factory`` (issue 39, item 3): the class alone against the env's own
episodes, then a real ``GRPOTrainer`` running two steps through it on a tool task and on a
TextArena game, its prompts, tool replies and logged rewards checked against in-process
episodes of the same rows."""

import copy
import inspect
import itertools
import json

import datasets
import gymnasium as gym
import pytest
import torch
from transformers.utils import get_json_schema
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import add_response_schema, qwen2_5_chat_template

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.integrations.trl import TRLEnvironment, environment_factory
from llm_gym.lm.loading import tiny_model

TEXTARENA = ("LLMChat-TextArena-v0", {"game": "GuessTheNumber-v0"})
PRODUCTS = ("LLMChat-Products-v0", {"tools": ["python"], "tool_format": "markdown", "max_turns": 2})
CODE = "```python\nprint(6 * 7)\n```"  # a move the env runs in its python sandbox
SIX_SEVEN = {"query": "What is 6 * 7?", "answer": "42"}


def factory(case, **more):
    env_id, env_args = case
    return environment_factory(env_id, **env_args, **more)


def after_the_end(total):
    return f"The episode is over (return {total}): this move was not played. Stop calling act."


def in_process(env_id, env_args, row, moves):
    """The env's own episode of ``row`` under ``moves``: what reset and each act must return
    (the documented text), and the return."""
    env = gym.make(env_id, **env_args)
    options = None if row.get("item") is None else {"item": row["item"]}
    obs, _ = env.reset(seed=row.get("seed"), options=options)
    opening = "\n\n".join(message["content"] for message in obs["history"])
    replies, total, done = [], 0.0, False
    for move in moves:
        if done:
            replies.append(after_the_end(total))
            continue
        obs, reward, terminated, truncated, _ = env.step(move)
        total += reward
        done = terminated or truncated
        # What the env added after the move: the next user turn, a tool's output.
        (turn,) = [i for i, m in enumerate(obs["history"]) if m["role"] == "assistant"][-1:]
        added = "\n\n".join(message["content"] for message in obs["history"][turn + 1 :])
        if done:
            how = "finished" if terminated else "cut off at its turn limit"
            end = (
                f"The episode is over ({how}): this move's reward is {reward}, "
                f"the episode's return {total}."
            )
            added = f"{added.rstrip()}\n\n{end}" if added.strip() else end
        replies.append(added)
    return opening, replies, total


# -- the class alone ----------------------------------------------------------------------


def products_answer(seed):
    env = gym.make(PRODUCTS[0], **PRODUCTS[1])
    return env.reset(seed=seed)[1]["answer"]


@pytest.mark.parametrize(
    ("case", "row", "moves"),
    [
        (TEXTARENA, {"seed": 3}, ["[10]", "[15]", "[12]", "[13]"]),  # won at the third guess
        (TEXTARENA, {"seed": 0}, ["[12]", "[12]", "[6]"]),  # hint, repeat warning, hint
        (PRODUCTS, {"seed": 0}, [CODE, products_answer(0), "1"]),  # tool, right answer
        (PRODUCTS, {"seed": 1}, [CODE, CODE, "1"]),  # cut off at max_turns=2
        (PRODUCTS, {"item": SIX_SEVEN}, ["42"]),
        (TEXTARENA, {"item": {"query": "GuessTheNumber-v0", "game_seed": 1576890651}}, ["[12]"]),
    ],
)
def test_reset_act_and_get_reward_give_the_envs_own_episode(case, row, moves):
    env = factory(case)()
    opening, replies, total = in_process(*case, row, moves)
    assert env.reset(prompt=[{"role": "user", "content": ""}], **row) == opening
    assert [env.act(move) for move in moves] == replies
    assert env.get_reward() == total and isinstance(env.get_reward(), float)


def test_what_the_replies_say():
    env = factory(TEXTARENA)()
    text = env.reset(seed=3)
    assert text.startswith("[GAME] You are Player 0. You are playing Guess The Number.")
    assert env.act("[10]") == "[GAME] The target number is higher."
    assert env.act("[12]") == (
        "The episode is over (finished): this move's reward is 1.0, the episode's return 1.0."
    )
    assert env.act("[13]") == after_the_end(1.0) and env.get_reward() == 1.0
    products = factory(PRODUCTS)()
    opening = products.reset(item=SIX_SEVEN)
    assert opening.startswith("A conversation between User and Assistant.")  # system prompt
    assert opening.endswith("without a code block.\n\nWhat is 6 * 7?")  # then the question
    assert products.act(CODE) == "42\n"  # the sandbox's output, the env's tool message
    assert products.act("```python\nprint(1)\n```") == (
        "1\n\nThe episode is over (cut off at its turn limit): this move's reward is 0.0, the "
        "episode's return 0.0."  # the tool's output, then the end (max_turns=2)
    )


def test_one_seed_one_episode_and_pooled_instances_start_afresh():
    cls = factory(PRODUCTS)
    first, second = cls(), cls()
    assert first.reset(seed=5) == second.reset(seed=5)  # a GRPO group shares its question
    assert first.reset(seed=5) != first.reset(seed=6)
    first.reset(item=SIX_SEVEN)
    first.act("42")
    assert first.get_reward() == 1.0
    first.reset(seed=None, item=None)  # an unseeded row: the env's own stream goes on
    assert first.get_reward() == 0.0 and first.act("0").startswith("The episode is over")


def test_the_row_prompt_is_kept_apart_from_the_opening():
    env = factory(TEXTARENA)()
    opening = env.reset(seed=3)
    assert env.reset(seed=3, prompt=[{"role": "user", "content": "Play well."}]) == (
        "\n\n" + opening  # TRL appends the text to the row's last user message as is
    )
    assert env.reset(seed=3, prompt=[{"role": "user", "content": "Play:\n"}]) == opening
    assert env.reset(seed=3, prompt="a str prompt", answer="ignored column") == opening


def test_hostile_moves_are_moves_or_refusals_never_exceptions():
    cls = factory(TEXTARENA, max_text_length=50)
    env = cls()
    assert env.act("[3]") == "No episode is running: reset() starts one. This move was not played."
    env.reset(seed=3)
    refused = env.act("[1]" * 40)
    assert refused.startswith("The environment refused this move (ValueError: action text has")
    assert refused.endswith("It was not played: make another move.")
    assert env.act("\ud800").startswith("The environment refused this move (ValueError:")
    # Not a str (the model's JSON): played as its JSON text, by the game's rules.
    _, replies, total = in_process(*TEXTARENA, {"seed": 3}, ['{"guess": 12}', "12", "[12]"])
    assert replies[0].startswith("[GAME] You attempted an invalid move.")
    assert [env.act({"guess": 12}), env.act(12), env.act("[12]")] == replies
    assert env.get_reward() == total
    for move in ("", " ", "\x00", "[" * 49, "🙂"):
        env.reset(seed=3)
        assert isinstance(env.act(move), str)


def test_trl_sees_one_tool_act_with_its_schema():
    cls = factory(TEXTARENA)
    assert cls.__name__ == "LLMChat_TextArena_v0" and issubclass(cls, TRLEnvironment)
    # What GRPOTrainer lists as tools: public functions of the class but reset and get_reward.
    members = inspect.getmembers(cls, predicate=inspect.isfunction)
    tools = [n for n, _ in members if n not in ("reset", "get_reward") and not n.startswith("_")]
    assert tools == ["act"] and {"reset", "get_reward"} <= {n for n, _ in members}
    schema = get_json_schema(cls().act)["function"]
    assert schema["name"] == "act" and schema["parameters"]["required"] == ["text"]
    assert schema["parameters"]["properties"]["text"]["type"] == "string"
    assert schema["description"].startswith("Take your turn in the environment")
    assert inspect.signature(cls.act).return_annotation in (str, "str")


def test_errors_name_what_is_wrong():
    with pytest.raises(gym.error.Error):
        environment_factory("Nope-v0")
    with pytest.raises(TypeError, match="env_id must be a registered env id"):
        environment_factory(3)
    with pytest.raises(TypeError, match="make its class with"):
        TRLEnvironment()
    env = factory(TEXTARENA)()
    with pytest.raises(TypeError, match="row column 'seed' must be None or an int"):
        env.reset(seed="3")
    with pytest.raises(ValueError, match="row column 'seed' must be None or an int >= 0"):
        env.reset(seed=-1)
    with pytest.raises(TypeError, match="row column 'item' must be a dict"):
        env.reset(item="GuessTheNumber-v0")
    tokens = environment_factory("LLMChat-Countdown-v0", input_mode="tokens", tokenizer=None)
    with pytest.raises(ValueError, match="tokenizer"):  # the env's own check, at construction
        tokens()


def test_an_env_without_history_observations_is_named(smollm2_tokenizer):
    cls = environment_factory(
        "LLMChat-Countdown-v0", input_mode="text", tokenizer=smollm2_tokenizer
    )
    with pytest.raises(ValueError, match="no 'history' to read text from"):
        cls().reset(seed=0)


# -- a real GRPOTrainer -------------------------------------------------------------------


def tool_call(move):
    # A call of the tool act as Qwen2.5's chat template writes it.
    arguments = json.dumps({"name": "act", "arguments": {"text": move}})
    return f"<tool_call>\n{arguments}\n</tool_call>"


def scripted_player(tokenizer, turn):
    """SmolLM2's tokenizer with a tool-calling chat template TRL parses (Qwen2.5's), and a
    tiny llama that answers every prompt with the tool calls ``act(move)`` for each move of
    ``turn`` in one assistant turn. Each call is one added token; the model's blocks add
    nothing (attention and MLP outputs zeroed), so a position's logits are its token's alone
    (a bigram model), and its head sends the generation prompt's last token to the first
    call, each call to the next and the last to end of turn, by far (a margin of hundreds
    of logits, so sampling at any temperature writes them)."""
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = qwen2_5_chat_template
    calls = [tool_call(move) if i == 0 else "\n" + tool_call(move) for i, move in enumerate(turn)]
    tokenizer.add_tokens(calls)
    add_response_schema(tokenizer)
    model = tiny_model(tokenizer, seed=0)
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.data.zero_()
        layer.mlp.down_proj.weight.data.zero_()
    prompt = [{"role": "user", "content": ""}]
    ends = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
    chain = [ends["input_ids"][-1], *tokenizer.convert_tokens_to_ids(calls)]
    chain.append(tokenizer.eos_token_id)
    with torch.no_grad():
        embed = model.model.embed_tokens.weight
        for token, following in itertools.pairwise(chain):
            model.lm_head.weight[following] = 50.0 * embed[token] / embed[token].norm()
    embed.requires_grad_(False)  # its backward would be most of a training step's time
    return model, tokenizer


@pytest.mark.parametrize(
    ("case", "rows", "turn", "returns"),
    [
        # Two seeds of a game, a guess a turn: [12] wins seed 3's game at once (its second
        # turn comes after the end); in seed 0's it is a hint, then a guess made already.
        (TEXTARENA, [{"seed": 3}, {"seed": 0}], ["[12]"], {1.0, 0.0}),
        # The tool task, two calls a turn: code the sandbox runs, then an answer; a row's
        # sample sets the question (right: 1.0), a seed draws one (wrong: 0.0); the second
        # turn's calls come after the end.
        (PRODUCTS, [{"seed": 0, "item": None}, {"seed": None, "item": SIX_SEVEN}],
         [CODE, "42"], {1.0, 0.0}),
    ],
)  # fmt: skip
@pytest.mark.slow
def test_grpo_trainer_plays_episodes_through_environment_factory(
    smollm2_tokenizer, tmp_path, monkeypatch, case, rows, turn, returns
):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    env_id, env_args = case
    cls = environment_factory(env_id, **env_args)
    model, tokenizer = scripted_player(smollm2_tokenizer, turn)
    calls = []

    def record(prompts, completions, environments, **columns):
        # TRL reuses the instances in the next step: read their returns now.
        returns = [env.get_reward() for env in environments]
        calls.append((prompts, completions, environments, returns, columns))
        return [0.0] * len(prompts)

    prompt = [{"role": "user", "content": ""}]
    dataset = datasets.Dataset.from_list([{"prompt": prompt, **row} for row in rows * 2])
    torch.manual_seed(0)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[record],
        args=GRPOConfig(
            output_dir=str(tmp_path),
            max_steps=2,
            per_device_train_batch_size=4,
            num_generations=2,
            max_completion_length=256,
            max_tool_calling_iterations=2,
            gradient_checkpointing=False,
            use_cpu=True,
            bf16=False,
            report_to="none",
            logging_steps=1,
            save_strategy="no",
            disable_tqdm=True,
            seed=0,
        ),
        train_dataset=dataset,
        processing_class=tokenizer,
        environment_factory=cls,
    )
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert len(calls) == len(logs) == 2
    seen, ended_early = set(), False
    for (prompts, completions, environments, got, columns), log in zip(calls, logs, strict=True):
        assert len(prompts) == len(environments) == 4
        assert all(type(env) is cls for env in environments)
        expected = []
        for i, completion in enumerate(completions):
            row = {key: columns[key][i] for key in rows[0]}
            # The moves TRL ran: each assistant turn's calls, then one tool message each.
            played = [
                call["function"]["arguments"]["text"]
                for message in completion
                for call in message.get("tool_calls") or []
            ]
            replies = [message["content"] for message in completion if message["role"] == "tool"]
            assert played[: len(replies)] == turn * 2 and len(replies) == 2 * len(turn)
            opening, env_replies, total = in_process(env_id, env_args, row, turn * 2)
            assert prompts[i][-1]["content"] == opening  # reset's text is the user turn
            assert replies == env_replies  # act returned what the env says, in order
            ended_early |= after_the_end(total) in replies  # a move after the end, refused
            assert got[i] == total  # get_reward()
            expected.append(total)
            seen.add(total)
        mean = sum(expected) / len(expected)
        assert log[f"rewards/{cls.__name__}/mean"] == pytest.approx(mean)
        assert log["reward"] == pytest.approx(mean)  # the recorder adds 0.0
        assert log["tools/call_frequency"] == pytest.approx(2 * len(turn))
        assert log["tools/failure_frequency"] == 0.0  # act never raised
    assert seen == returns  # both outcomes happened: the logged means are not all zero
    assert ended_early
