"""TransformersPolicy in generate mode, its versions, and its errors."""

import numpy as np
import pytest
import torch
from gsm8k_fixture import make_gsm8k_vector_env
from policy_fixture import QUERIES, SYSTEM, chat_obs, oracle_log_probs

from llm_gym import ChatEnv, Response
from llm_gym.lm.loading import tiny_model
from llm_gym.policies import LogProbOutput, TransformersPolicy
from llm_gym.rewards.gsm8k import extract_answer

# -- generate mode -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sampling",
    [{"do_sample": False}, {"do_sample": True, "temperature": 0.7, "top_k": 20}],
    ids=["greedy", "sampled-T0.7"],
)
def test_generated_log_probs_match_plain_forward(smol, sampling):
    model, tok = smol
    torch.manual_seed(0)
    obs = chat_obs(*QUERIES, tokenizer=tok, history_only=False)
    policy = TransformersPolicy(model, tok, generate_kwargs={"max_tokens": 12, **sampling})
    responses = policy(obs)  # history mode, a batch of two prompts of different lengths
    assert len(responses) == 2
    for prompt_ids, response in zip(obs["tokens"], responses, strict=True):
        assert 0 < len(response.tokens) <= 12
        assert response.text == tok.decode(response.tokens.tolist())
        expected = oracle_log_probs(model, prompt_ids, response.tokens)
        np.testing.assert_allclose(response.log_probs, expected, atol=1e-4)
        assert np.all(response.log_probs < 0)


def test_sampled_log_probs_are_raw_not_temperature_scaled(smol):
    model, tok = smol
    torch.manual_seed(1)
    obs = chat_obs(QUERIES[0], tokenizer=tok, history_only=False)
    policy = TransformersPolicy(
        model, tok, generate_kwargs={"max_tokens": 6, "do_sample": True, "temperature": 0.5}
    )
    (response,) = policy(obs)
    ids = torch.as_tensor(np.concatenate([obs["tokens"][0], response.tokens]))[None]
    with torch.no_grad():
        logits = model(ids).logits[0, len(obs["tokens"][0]) - 1 : -1]
    scaled = torch.log_softmax(logits / 0.5, -1).gather(-1, ids[0, -len(response.tokens) :, None])
    assert np.abs(response.log_probs - scaled.squeeze(-1).numpy()).max() > 1e-2


def test_smollm2_answers_a_gsm8k_question_offline(smol):
    model, tok = smol
    # From GSM8K's test split; SmolLM2-135M gets this one right greedily (most it does not).
    question = (
        "Andy plants 90 geraniums and 40 fewer petunias that geraniums. "
        "How many flowers does he plant total?"
    )
    policy = TransformersPolicy(model, tok, generate_kwargs={"max_tokens": 64, "do_sample": False})
    response = policy({"history": ({"role": "user", "content": question},)})
    assert "#### 140" in response.text
    assert extract_answer(response.text, "last_number") == "140"
    # Sampled ids end at the first EOS (<|im_end|>, also the pad token), which is kept.
    eos = tok.eos_token_id
    assert eos == tok.pad_token_id
    assert response.tokens[-1] == eos and eos not in response.tokens[:-1].tolist()
    assert response.text.endswith("<|im_end|>")


def test_batch_of_mixed_length_prompts_gives_the_same_tokens_as_one_at_a_time(smol):
    model, tok = smol
    queries = ["Hi!", QUERIES[1], "Write the number seven as a digit."]
    policy = TransformersPolicy(model, tok, generate_kwargs={"max_tokens": 8, "do_sample": False})
    batched = policy(chat_obs(*queries))
    for query, response in zip(queries, batched, strict=True):
        obs = chat_obs(query)
        single = policy({"history": obs["history"][0]})
        np.testing.assert_array_equal(response.tokens, single.tokens)
        np.testing.assert_allclose(response.log_probs, single.log_probs, atol=1e-4)


def test_num_samples_gives_that_many_responses_per_observation(tiny):
    model, tok = tiny
    kwargs = {"max_tokens": 4, "do_sample": True}
    policy = TransformersPolicy(model, tok, num_samples=3, generate_kwargs=kwargs)
    batch = policy(chat_obs("a", "a longer question"))
    assert [len(group) for group in batch] == [3, 3]
    for group in batch:
        for response in group:
            assert isinstance(response, Response)
            assert 1 <= len(response.tokens) <= 4 and len(response.log_probs) == len(
                response.tokens
            )
    single = policy({"history": chat_obs("a")["history"][0]})
    assert isinstance(single, list) and len(single) == 3
    # The alias n sets num_samples too.
    aliased = TransformersPolicy(model, tok, generate_kwargs={**kwargs, "n": 2})
    assert aliased.num_samples == 2 and len(aliased(chat_obs("a"))[0]) == 2


def test_return_log_probs_false_leaves_them_out(tiny):
    model, tok = tiny
    policy = TransformersPolicy(
        model, tok, return_log_probs=False, generate_kwargs={"max_tokens": 3}
    )
    response = policy(chat_obs("a"))[0]
    assert response.log_probs is None and len(response.tokens) >= 1


@pytest.mark.parametrize("mode", ["history", "text", "tokens"])
def test_policy_drives_chat_env_for_three_turns(tiny, mode):
    model, tok = tiny
    env = ChatEnv(mode, tokenizer=tok, query=QUERIES[0], system_prompt=SYSTEM, max_turns=3)
    policy = TransformersPolicy(model, tok, input_mode=mode, generate_kwargs={"max_tokens": 5})
    obs, _ = env.reset(seed=0)
    for turn in range(3):
        action = policy(obs)
        assert isinstance(action, Response) and action.log_probs.shape == action.tokens.shape
        prompt = obs
        obs, reward, terminated, truncated, _ = env.step(action)
        assert env.observation_space.contains(obs)
        assert (terminated, truncated) == (False, turn == 2)
        if mode == "tokens":  # the sampled ids are appended exactly, never re-tokenized
            n = len(prompt["tokens"])
            np.testing.assert_array_equal(obs["tokens"][n : n + len(action.tokens)], action.tokens)
    assert env.history.roles == ["system", "user", "assistant", "assistant", "assistant"]


@pytest.mark.parametrize("mode", ["history", "text", "tokens"])
def test_policy_acts_on_a_native_vector_env(tiny, mode):
    model, tok = tiny
    rows = [{"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"} for i in range(3)]
    envs = make_gsm8k_vector_env(3, dataset=rows, input_mode=mode, tokenizer=tok)
    policy = TransformersPolicy(model, tok, input_mode=mode, generate_kwargs={"max_tokens": 3})
    obs, _ = envs.reset(seed=0)
    actions = policy(obs)
    assert len(actions) == 3 and all(isinstance(a, Response) for a in actions)
    _, rewards, terminated, _, _ = envs.step(actions)
    assert rewards.shape == (3,) and terminated.all()


# -- versions and errors -------------------------------------------------------------------


def test_get_new_version_shares_the_model(tiny):
    model, tok = tiny
    policy = TransformersPolicy(
        model, tok, num_samples=2, generate_kwargs={"do_sample": True, "max_tokens": 3}
    )
    scorer = policy.get_new_version(generate=False)
    assert scorer.model is policy.model and scorer.tokenizer is tok
    assert (scorer.generate, scorer.num_samples, scorer.input_mode) == (False, None, "history")
    back = scorer.get_new_version(generate=True, input_mode="text")
    assert back.model is model and back.generate_kwargs["max_new_tokens"] == 3
    with pytest.raises(TypeError, match=r"unknown arguments \['temperature'\]"):
        policy.get_new_version(temperature=0.5)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"generate_kwargs": {"max_tokenz": 3}}, ValueError, r"unknown keys \['max_tokenz'\]"),
        (
            {"generate_kwargs": {"max_tokens": 3, "max_new_tokens": 4}},
            ValueError,
            "both 'max_tokens' and 'max_new_tokens'",
        ),
        ({"generate_kwargs": {"output_scores": True}}, ValueError, "may not set 'output_scores'"),
        ({"generate_kwargs": {"stop_strings": ["x"]}}, ValueError, "may not set 'stop_strings'"),
        ({"generate_kwargs": {"num_beams": 2}}, ValueError, r"'num_beams'\] must be 1, got 2"),
        ({"generate_kwargs": [("max_tokens", 3)]}, TypeError, "generate_kwargs must be a dict"),
        ({"num_samples": 2}, ValueError, "num_samples=2 needs sampling"),
        ({"num_samples": 0}, ValueError, "num_samples must be None or an int >= 1, got 0"),
        ({"num_samples": 2, "generate_kwargs": {"do_sample": True, "n": 3}}, ValueError, "differs"),
        ({"num_samples": 2, "generate": False}, ValueError, "num_samples applies to generate mode"),
        (
            {"generate": False, "return_log_probs": False},
            ValueError,
            "return_log_probs must be True",
        ),
        ({"input_mode": "image"}, ValueError, r"input_mode must be one of .* got 'image'"),
        ({"chat_template_name": "nope"}, ValueError, "chat_template_name must be one of"),
        ({"pad_output": 1}, TypeError, "pad_output must be a bool, got int"),
    ],
)
def test_bad_constructor_arguments(tiny, kwargs, error, message):
    model, tok = tiny
    with pytest.raises(error, match=message):
        TransformersPolicy(model, tok, **kwargs)


def test_bad_model_or_tokenizer(tiny, gpt2_tokenizer):
    model, tok = tiny
    with pytest.raises(TypeError, match="model must be a transformers causal LM .* got str"):
        TransformersPolicy("gpt2", tok)
    with pytest.raises(TypeError, match="tokenizer must be a transformers tokenizer, got NoneType"):
        TransformersPolicy(model, None)
    small = tiny_model(vocab_size=256)
    with pytest.raises(
        ValueError, match="tokenizer has 50257 tokens but the model's embedding has only 256"
    ):
        TransformersPolicy(small, gpt2_tokenizer)


def test_bad_observations_and_responses_raise_and_leave_the_policy_usable(tiny):
    model, tok = tiny
    policy = TransformersPolicy(model, tok, generate_kwargs={"max_tokens": 2})
    scorer = policy.get_new_version(generate=False)
    obs = chat_obs("a")
    cases = [
        (policy, ("hello",), TypeError, "obs must be a dict observation .* got str"),
        (policy, ({"text": "hi"},), ValueError, r"obs has no 'history' key .* got keys \['text'\]"),
        (
            policy,
            ({"history": "hi"},),
            TypeError,
            r"obs\['history'\] must be a tuple of .* got str",
        ),
        (policy, ({"history": ()},), ValueError, r"obs\['history'\] is empty"),
        (
            policy,
            (obs, [Response("x")]),
            RuntimeError,
            r"this policy generates .* policy.get_new_version\(generate=False\)",
        ),
        (scorer, (obs, ["x", "y"]), ValueError, "got 2 responses for 1 observations"),
        (
            scorer,
            (obs, "x"),
            TypeError,
            "responses must be a list with one response per observation",
        ),
        (
            scorer,
            (obs, [3.5]),
            TypeError,
            "each response must be a Response, a str or a 1-D int64 array",
        ),
        (scorer, (obs, [np.array([10**6])]), ValueError, r"token ids must lie in \[0, 49152\)"),
    ]
    for target, args, error, message in cases:
        with pytest.raises(error, match=message):
            target(*args)
    text_policy = policy.get_new_version(input_mode="text")
    with pytest.raises(TypeError, match=r"obs\['text'\] must be a str .* got int"):
        text_policy({"text": 3})
    token_scorer = scorer.get_new_version(input_mode="tokens")
    with pytest.raises(TypeError, match=r"obs\['tokens'\] must be a 1-D int64 array .* float64"):
        token_scorer({"tokens": np.array([1.0, 2.0])})
    # Nothing above changed the policies.
    assert isinstance(policy(obs)[0], Response)
    assert isinstance(scorer(obs, ["x"])[0], LogProbOutput)
