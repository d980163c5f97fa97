"""Nothing lost, nothing silently wrong: a step happens whole or not at all, a finished
episode takes no more steps, hostile text is scored fast."""

import warnings

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import llm_gym
from llm_gym.envs import DatasetChatEnv
from llm_gym.rewards import extract_answer, score_gsm8k

ROWS = [{"question": "9*2?", "answer": "#### 18"}]


def state(env):
    conversation = env.unwrapped.conversation
    return (conversation.history.to_chats(), conversation.text, conversation.tokens)


def test_a_step_that_cannot_be_tokenized_changes_nothing(gpt2_tokenizer):
    env = gym.make(
        "LLMChat-GSM8K-v0", dataset=ROWS, input_mode="tokens", tokenizer=gpt2_tokenizer,
        observation_keys=("tokens", "text", "history"), max_turns=3,
    )  # fmt: skip
    env.reset(seed=0)
    before = state(env)
    with pytest.raises(Exception):  # noqa: B017 (the tokenizer's own error for a lone surrogate)
        env.step("\ud800")
    after = state(env)
    assert before[0] == after[0] and before[1] == after[1]
    assert np.array_equal(before[2], after[2])
    obs, reward, terminated, *_ = env.step("<answer>18</answer>")
    assert (reward, terminated) == (1.0, True) and obs["history"][-1][
        "content"
    ] == "<answer>18</answer>"


def test_a_reward_that_rejects_its_sample_changes_nothing():
    env = gym.make("LLMChat-GSM8K-v0", dataset=[{"question": "q", "answer": 18}], max_turns=2)
    env.reset(seed=0)
    with pytest.raises(TypeError, match="answer must be a str, got int"):
        env.step("<answer>18</answer>")
    assert (
        env.unwrapped.history.roles == ["system", "user"] and env.unwrapped.conversation.turns == 0
    )


@pytest.mark.parametrize("max_turns", [1, 2])
def test_a_finished_episode_takes_no_more_steps(max_turns):
    env = DatasetChatEnv([{"query": "hi"}], max_turns=max_turns)
    env.reset(seed=0)
    for _ in range(max_turns):
        *_, terminated, truncated, _ = env.step("x")
    assert terminated or truncated
    with pytest.raises(gym.error.ResetNeeded, match="the episode has ended"):
        env.step("again")
    assert len(env.history) == 1 + max_turns  # the refused step appended nothing
    env.reset()
    assert env.step("x")[0]["history"][-1]["content"] == "x"


def test_gsm8k_pays_once_per_episode():
    env = gym.make("LLMChat-GSM8K-v0", dataset=ROWS)
    env.reset(seed=0)
    assert env.step("<answer>18</answer>")[1] == 1.0
    with pytest.raises(gym.error.ResetNeeded):
        env.step("<answer>18</answer>")


@pytest.mark.parametrize(
    "hostile", ["<answer>" * 20_000, "<think>" * 20_000, "\\boxed{" * 20_000, "####" * 40_000]
)
def test_hostile_text_is_scored_in_linear_time(hostile):
    # These took 27 s and 140 s with backtracking regexes; each mode is now one pass.
    assert score_gsm8k(hostile, "#### 1").reward == 0.0
    assert all(extract_answer(hostile, mode) is None for mode in ("tags", "boxed", "hash"))


# -- the KL path ------------------------------------------------------------------------


class ConstantScorer:
    """Scores every response token with one value."""

    generate = False

    def __init__(self, value):
        self.value = value

    def __call__(self, obs, responses=None, *, response_only=False):
        from llm_gym.chat import LogProbs

        batch = responses if isinstance(responses, list) else [responses]
        outs = [
            type("Out", (), {"log_probs": LogProbs(response=np.full(len(r.tokens), self.value))})
            for r in batch
        ]
        return outs if isinstance(responses, list) else outs[0]


def test_non_finite_log_probs_are_rejected_before_the_env_steps():
    from llm_gym import ChatEnv, Response
    from llm_gym.wrappers import KLRewardWrapper, vector

    env = KLRewardWrapper(ChatEnv(query="hi", max_turns=1), ConstantScorer(-1.0), coef=0.1)
    env.reset(seed=0)
    bad = Response("ab", [1, 2], [-0.5, -np.inf])
    with pytest.raises(
        ValueError, match="Response.log_probs must be finite, got -inf at response token 1"
    ):
        env.step(bad)
    assert env.unwrapped.history.roles == ["user"]  # nothing happened
    ref_inf = KLRewardWrapper(ChatEnv(query="hi", max_turns=1), ConstantScorer(-np.inf))
    ref_inf.reset(seed=0)
    with pytest.raises(
        ValueError, match="info\\['ref_log_probs'\\] must be finite, got -inf at response token 0"
    ):
        ref_inf.step(Response("ab", [1, 2], [-0.5, -0.5]))
    envs = llm_gym.DatasetChatVectorEnv(DatasetChatEnv([{"query": "a"}, {"query": "b"}]), 2)
    venv = vector.KLRewardWrapper(envs, ConstantScorer(-1.0))
    venv.reset(seed=0)
    good = Response("ab", [1, 2], [-0.5, -0.5])
    with pytest.raises(
        ValueError, match="sub-env 1: the action's Response.log_probs must be finite, got nan"
    ):
        venv.step([good, Response("ab", [1, 2], [-0.5, np.nan])])


def test_overwrite_leaves_no_file_of_the_earlier_run(tmp_path):
    from llm_gym.run.rollout import EPISODES_FILE, ROLLOUT_PLOT_FILE, SUMMARY_FILE, prepare_out

    for name in (EPISODES_FILE, SUMMARY_FILE, ROLLOUT_PLOT_FILE):
        (tmp_path / name).write_text("earlier run")
    episodes = prepare_out(tmp_path)
    assert episodes == tmp_path / EPISODES_FILE
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_reference_below_float32_warns_once(gpt2_tokenizer):
    import torch

    from llm_gym import ChatEnv, TransformersPolicy
    from llm_gym.lm.loading import tiny_model
    from llm_gym.wrappers import KLRewardWrapper

    # A fresh reference: the warning comes once per reference model, whatever ran before.
    ref = TransformersPolicy(
        tiny_model(gpt2_tokenizer).to(torch.bfloat16), gpt2_tokenizer, generate=False
    )
    with pytest.warns(UserWarning, match="scores in bfloat16, below float32.*Pass gen_model="):
        KLRewardWrapper(ChatEnv(query="hi"), ref)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not again for the same reference
        KLRewardWrapper(ChatEnv(query="hi"), ref)


# -- errors that name the argument ---------------------------------------------------------


def test_bad_arguments_and_actions_name_what_was_expected(gpt2_tokenizer):
    from llm_gym import ChatEnv
    from llm_gym.wrappers import KLComputation

    tokens = ChatEnv("tokens", tokenizer=gpt2_tokenizer, query="hi", max_text_length=50)
    tokens.reset(seed=0)
    cases = [
        (
            lambda: tokens.step(np.array([-1, 5])),
            ValueError,
            "token ids must lie in \\[0, 50257\\), got -1",
        ),
        (
            lambda: tokens.step("\ud800"),
            ValueError,
            "action text is not valid Unicode: surrogates not allowed",
        ),
        (
            lambda: tokens.step("x" * 51),
            ValueError,
            "action text has 51 characters, more than max_text_length=50",
        ),
        (
            lambda: ChatEnv(observation_keys="history"),
            TypeError,
            "observation_keys must be a tuple of input modes, e.g. \\('history',\\)",
        ),
        (
            lambda: ChatEnv(max_turns=True),
            ValueError,
            "max_turns must be None or an int >= 1, got True",
        ),
        (
            lambda: ChatEnv(query="q").reset(options=["q"]),
            TypeError,
            "options must be a dict or None, got list",
        ),
        (
            lambda: ChatEnv(query="q").reset(options={"qury": "x"}),
            ValueError,
            "options may hold 'query' or 'history', got unknown keys \\['qury'\\]",
        ),
        (
            lambda: DatasetChatEnv(ROWS, field_map={"question": "query"}, shuffle="no"),
            TypeError,
            "shuffle must be a bool, got str",
        ),
        (
            lambda: KLComputation(ChatEnv(query="q"), coef="0.1"),
            TypeError,
            "coef must be a finite number >= 0, got '0.1'",
        ),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match):
            call()
    assert tokens.step(np.array([40, 41]))[0]["tokens"][-2:].tolist() != [-1, 5]  # still usable


def test_a_dataset_without_the_fields_the_reward_reads_fails_at_construction():
    with pytest.raises(
        ValueError,
        match="lack the fields \\['answer'\\] the task's reward reads; its fields are \\['qu",
    ):
        gym.make("LLMChat-GSM8K-v0", dataset=[{"question": "q"}])
    with pytest.raises(ValueError, match="lack the fields \\['solution'\\]"):
        gym.make("LLMChat-MATH-v0", dataset=[{"problem": "q"}])


def test_native_vector_reset_checks_its_seed():
    envs = llm_gym.DatasetChatVectorEnv(DatasetChatEnv([{"query": "a"}]), 2)
    with pytest.raises(
        TypeError, match="seed must be None, an int or a list of num_envs ints, got float: 1.5"
    ):
        envs.reset(seed=1.5)
    with pytest.raises(ValueError, match="must have num_envs=2 entries, got 3"):
        envs.reset(seed=[1, 2, 3])


def test_an_empty_or_blank_data_file_is_named(tmp_path):
    (tmp_path / "test.jsonl").write_text("")
    (tmp_path / "train.jsonl").write_text("\n \n")
    for split in ("test", "train"):
        with pytest.raises(
            ValueError, match=f"{split}.jsonl' holds no items \\(it is empty or only blank"
        ):
            gym.make("LLMChat-GSM8K-v0", data_dir=tmp_path, split=split)


def test_what_the_policy_said_is_kept_as_said(smollm2_tokenizer):
    from llm_gym import ChatEnv, Response

    env = ChatEnv(
        "tokens", tokenizer=smollm2_tokenizer, query="hi", max_turns=3,
        observation_keys=("tokens", "text", "history"),
    )  # fmt: skip
    env.reset(seed=0)
    obs, *_ = env.step("<|im_end|><|im_end|>")
    assert obs["history"][-1]["content"] == "<|im_end|><|im_end|>"
    decoded = smollm2_tokenizer.decode(obs["tokens"].tolist(), skip_special_tokens=False)
    assert decoded == obs["text"]  # tokens and text agree
    # A sampled response's closing end-of-turn token is the turn's end, counted once.
    end = smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")
    sampled = np.asarray(smollm2_tokenizer("fine")["input_ids"] + [end])
    obs, *_ = env.step(Response("fine<|im_end|>", sampled))
    assert obs["history"][-1]["content"] == "fine"
    assert (
        smollm2_tokenizer.decode(obs["tokens"].tolist(), skip_special_tokens=False) == obs["text"]
    )
    history = ChatEnv(query="hi", max_turns=1)
    history.reset(seed=0)
    assert history.step("Use <s>old</s>")[0]["history"][-1]["content"] == "Use <s>old</s>"


# -- all-or-nothing vector steps ------------------------------------------------------------

VALID = st.sampled_from(["<answer>1</answer>", "thinking", "", "<answer>2</answer>"])
INVALID = st.one_of(
    st.integers(),
    st.just("\ud800"),
    st.just("x" * 300),
    st.builds(lambda n: np.arange(n, dtype=np.int64), st.integers(1, 3)),
)


def sub_env_states(envs):
    return [
        (c.history.to_chats(), c.turns, source.position)
        for c, source in zip(envs.conversations, envs.sources, strict=True)
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.one_of(VALID, INVALID), min_size=3, max_size=3), min_size=1, max_size=6)
)
def test_vector_step_is_all_or_nothing(batches):
    rows = [{"question": f"{i}+0?", "answer": f"#### {i}"} for i in range(5)]
    envs = gym.make_vec(
        "LLMChat-GSM8K-v0", num_envs=3, dataset=rows, max_turns=2, max_text_length=200
    )
    obs, _ = envs.reset(seed=0)
    for actions in batches:
        before = sub_env_states(envs.unwrapped)
        try:
            obs, *_ = envs.step(actions)
        except (TypeError, ValueError) as error:
            assert str(error).startswith("actions[")
            assert sub_env_states(envs.unwrapped) == before  # no sub-env moved
        else:
            assert all(isinstance(a, str) and len(a) <= 200 and a != "\ud800" for a in actions)
            # Each sub-env took its turn: an assistant turn, or a new episode's user turn.
            assert {h[-1]["role"] for h in obs["history"]} <= {"assistant", "user"}


def test_generation_lengths_are_checked_at_construction(gpt2_tokenizer):
    from llm_gym import TransformersPolicy
    from llm_gym.lm.loading import tiny_model

    model = tiny_model(gpt2_tokenizer)
    for key, value in (("max_new_tokens", -1), ("max_tokens", 0), ("max_length", 2.5)):
        name = "max_new_tokens" if key == "max_tokens" else key
        with pytest.raises(ValueError, match=f"generate_kwargs\\['{name}'\\] must be an int >= 1"):
            TransformersPolicy(model, gpt2_tokenizer, generate_kwargs={key: value})


@pytest.mark.parametrize(
    "env_id, kwargs",
    [
        ("LLMChat-v0", {"query": "hi"}),
        ("LLMChat-GSM8K-v0", {"dataset": ROWS}),
        ("LLMChat-Countdown-v0", {}),
        ("LLMChat-ReasoningGym-v0", {}),
        ("LLMToken-GSM8K-v0", {"dataset": ROWS, "max_new_tokens": 2}),
    ],
)
def test_a_rejected_first_reset_leaves_the_env_usable(env_id, kwargs, gpt2_tokenizer):
    if env_id.startswith("LLMToken"):
        kwargs = {**kwargs, "tokenizer": gpt2_tokenizer}
    env = gym.make(env_id, **kwargs)
    # Gymnasium's PassiveEnvChecker would keep no reset data after this and fail the
    # first step with "cannot unpack non-iterable NoneType"; llm_gym's ids run without it.
    assert env.spec.disable_env_checker is True
    with pytest.raises(ValueError, match="bogus"):
        env.reset(options={"bogus": 1})
    obs, _ = env.reset(seed=0)
    action = 0 if env_id.startswith("LLMToken") else "an answer"
    assert env.observation_space.contains(env.step(action)[0])
