"""TransformersPolicy: log-probs against an independent forward pass, masks, padding, errors."""

import numpy as np
import pytest
import torch

from llm_gym import ChatEnv, History, Response
from llm_gym.models import tiny_model
from llm_gym.policies import LogProbOutput, MaskedCategorical, TransformersPolicy
from llm_gym.rewards.gsm8k import extract_answer
from llm_gym.tasks import make_gsm8k_vector_env

SYSTEM = "You are a helpful assistant."
QUERIES = ["What is 2+2?", "Name a colour of the sky on a clear day, in one word please."]


def oracle_log_probs(model, prompt_ids, response_ids):
    """log π(response | prompt) from one plain, unpadded forward pass: log_softmax + gather."""
    ids = torch.as_tensor(np.concatenate([prompt_ids, response_ids]))[None]
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    log_probs = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    return log_probs[len(prompt_ids) - 1 :].numpy()


def chat_obs(*queries, tokenizer=None, history_only=True):
    """A batched observation of [system, user] conversations, with their prompt tokens."""
    keys = ("history",) if history_only else ("history", "text", "tokens")
    envs = [
        ChatEnv(tokenizer=tokenizer, system_prompt=SYSTEM, observation_keys=keys) for _ in queries
    ]
    observations = [
        env.reset(options={"query": q})[0] for env, q in zip(envs, queries, strict=True)
    ]
    return {key: tuple(o[key] for o in observations) for key in keys}


@pytest.fixture(scope="module")
def smol(default_model):
    return default_model


@pytest.fixture(scope="module")
def tiny(smollm2_tokenizer):
    """A random 2-layer llama over SmolLM2's vocabulary."""
    return tiny_model(smollm2_tokenizer), smollm2_tokenizer


@pytest.fixture(scope="module")
def tiny_gpt2(gpt2_tokenizer):
    """A random 2-layer GPT-2 (absolute positions) with GPT-2's tokenizer: pad == eos."""
    return tiny_model(gpt2_tokenizer, arch="gpt2", seed=1), gpt2_tokenizer


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


# -- log-prob mode -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sampled(smol):
    """A prompt (in all three forms) and a response SmolLM2 sampled for it."""
    model, tok = smol
    obs = chat_obs(QUERIES[0], tokenizer=tok, history_only=False)
    obs = {key: value[0] for key, value in obs.items()}
    torch.manual_seed(2)
    policy = TransformersPolicy(model, tok, generate_kwargs={"max_tokens": 10, "do_sample": True})
    return obs, policy(obs)


@pytest.mark.parametrize("mode", ["history", "text", "tokens"])
def test_log_prob_mode_matches_plain_forward(smol, sampled, mode):
    model, tok = smol
    obs, response = sampled
    scorer = TransformersPolicy(model, tok, input_mode=mode, generate=False)
    out = scorer(obs, response)
    assert isinstance(out, LogProbOutput)
    expected = oracle_log_probs(model, obs["tokens"], response.tokens)
    np.testing.assert_allclose(out.log_probs.response, expected, atol=1e-4)
    np.testing.assert_allclose(out.log_probs.response, response.log_probs, atol=1e-4)
    np.testing.assert_array_equal(out.tokens.prompt, obs["tokens"])
    np.testing.assert_array_equal(out.tokens.response, response.tokens)
    full = out.log_probs.full
    assert full.shape == out.input_ids.shape and full[0] == 0.0 and np.all(full[1:] < 0)
    assert out.masks.all_attention_mask.all()
    np.testing.assert_array_equal(
        out.masks.all_assistant_mask[len(obs["tokens"]) :], np.ones(len(response.tokens), bool)
    )


def test_log_prob_mode_scores_a_whole_conversation(smol):
    model, tok = smol
    messages = (
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    )
    out = TransformersPolicy(model, tok, generate=False)({"history": messages})
    prompt = History(messages[:1]).apply_chat_template(
        tok, add_generation_prompt=True, tokenize=True
    )
    np.testing.assert_array_equal(out.tokens.prompt, prompt)
    assert tok.decode(out.tokens.response.tolist()) == "4<|im_end|>\n"
    expected = oracle_log_probs(model, prompt, out.tokens.response)
    np.testing.assert_allclose(out.log_probs.response, expected, atol=1e-4)


def test_assistant_mask_selects_exactly_the_assistant_tokens(smol):
    model, tok = smol
    messages = (
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Hi, who are you?"},
        {"role": "assistant", "content": "I am a bot."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "It is 4."},
    )
    out = TransformersPolicy(model, tok, generate=False)({"history": messages})
    mask = out.masks.all_assistant_mask
    # Contiguous runs of the mask, decoded: each assistant turn's content and its end marker.
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    runs = [
        tok.decode(out.input_ids[a:b].tolist())
        for a, b in zip(edges[::2], edges[1::2], strict=True)
    ]
    assert runs == ["I am a bot.<|im_end|>", "It is 4.<|im_end|>"]


def test_pad_equal_to_eos_keeps_real_eos_log_probs(tiny_gpt2):
    model, tok = tiny_gpt2
    eos = tok.eos_token_id
    assert tok.pad_token_id == eos == 50256
    # Prompts of different lengths (so the shorter is left-padded with eos ids), one holding
    # a real eos; responses ending in eos.
    prompts = [np.array([464, 3290, eos, 318]), np.array([40, 588])]
    responses = [np.array([257, 1310, eos]), np.array([11, eos])]
    scorer = TransformersPolicy(model, tok, input_mode="tokens", generate=False)
    outs = scorer({"tokens": prompts}, responses)
    for prompt, response, out in zip(prompts, responses, outs, strict=True):
        expected = oracle_log_probs(model, prompt, response)
        np.testing.assert_allclose(out.log_probs.response, expected, atol=1e-4)
        assert out.log_probs.response[-1] < -1.0  # a real log-prob, not a zeroed pad
    assert outs[0].log_probs.prompt[2] < -1.0  # the eos inside the prompt too

    # Generation: force eos as the last token; its log-prob comes from the raw logits.
    policy = TransformersPolicy(
        model,
        tok,
        input_mode="tokens",
        generate_kwargs={"max_tokens": 4, "forced_eos_token_id": eos, "pad_token_id": eos},
    )
    for prompt, response in zip(prompts, policy({"tokens": prompts}), strict=True):
        assert response.tokens[-1] == eos
        expected = oracle_log_probs(model, prompt, response.tokens)
        np.testing.assert_allclose(response.log_probs, expected, atol=1e-4)
        assert response.log_probs[-1] < -1.0


def test_batched_log_probs_equal_unbatched_with_absolute_positions(tiny_gpt2):
    model, tok = tiny_gpt2
    prompts = [np.array([464, 3290, 318, 11, 257]), np.array([40])]
    responses = [np.array([1310, 13]), np.array([588, 11, 257, 13])]
    scorer = TransformersPolicy(model, tok, input_mode="tokens", generate=False)
    batched = scorer({"tokens": prompts}, responses)
    for prompt, response, out in zip(prompts, responses, batched, strict=True):
        single = scorer({"tokens": prompt}, response)
        np.testing.assert_allclose(out.log_probs.full, single.log_probs.full, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt2-no-logits_to_keep"])
def test_response_only_matches_the_full_forward(tiny, tiny_gpt2, arch):
    model, tok = tiny if arch == "llama" else tiny_gpt2
    # Prompts and responses of different lengths, one response empty, so the window (the
    # longest response + 1) covers prompt tokens and padding of the other rows.
    prompts = [np.array([464, 3290, 318, 11, 257]), np.array([40]), np.array([11, 13, 40])]
    responses = [np.array([1310, 13]), np.array([588, 11, 257, 13]), np.array([], dtype=np.int64)]
    scorer = TransformersPolicy(model, tok, input_mode="tokens", generate=False)
    if arch.endswith("no-logits_to_keep"):
        scorer._keeps_logits = False  # models whose forward lacks it: logits sliced after
    full = scorer({"tokens": prompts}, responses)
    window = scorer({"tokens": prompts}, responses, response_only=True)
    for prompt, response, f, w in zip(prompts, responses, full, window, strict=True):
        assert w.log_probs.full is None and w.log_probs.prompt is None
        assert w.log_probs.response.shape == response.shape
        np.testing.assert_allclose(w.log_probs.response, f.log_probs.response, atol=1e-5)
        np.testing.assert_allclose(
            w.log_probs.response, oracle_log_probs(model, prompt, response), atol=1e-4
        )
        np.testing.assert_array_equal(w.tokens.response, response)
    single = scorer({"tokens": prompts[1]}, responses[1], response_only=True)
    np.testing.assert_allclose(single.log_probs.response, full[1].log_probs.response, atol=1e-5)


def test_response_only_needs_responses_and_unpadded_output(tiny):
    model, tok = tiny
    scorer = TransformersPolicy(model, tok, generate=False)
    obs = chat_obs("a")
    with pytest.raises(ValueError, match="response_only=True needs responses .* got responses=No"):
        scorer(obs, response_only=True)
    padded = scorer.get_new_version(pad_output=True)
    with pytest.raises(ValueError, match="response_only=True needs .* pad_output=True"):
        padded(obs, ["x"], response_only=True)
    out = padded(obs, ["x"])  # still usable, and full log-probs as before
    assert out.log_probs.full.shape == out.input_ids.shape


def test_pad_output_gives_one_left_padded_batch(tiny_gpt2):
    model, tok = tiny_gpt2
    prompts = [np.array([464, 3290, 318]), np.array([40])]
    responses = [np.array([1310]), np.array([588, 11])]
    scorer = TransformersPolicy(model, tok, input_mode="tokens", generate=False)
    unpadded = scorer({"tokens": prompts}, responses)
    padded = scorer.get_new_version(pad_output=True)({"tokens": prompts}, responses)
    assert padded.input_ids.shape == padded.log_probs.full.shape == (2, 4)
    np.testing.assert_array_equal(padded.masks.all_attention_mask, [[1, 1, 1, 1], [0, 1, 1, 1]])
    np.testing.assert_array_equal(padded.masks.all_assistant_mask, [[0, 0, 0, 1], [0, 0, 1, 1]])
    np.testing.assert_allclose(padded.log_probs.full[1, 1:], unpadded[1].log_probs.full, atol=1e-5)
    assert padded.log_probs.full[1, 0] == 0.0 and padded.tokens is None


# -- get_dist ------------------------------------------------------------------------------


def test_get_dist_masks_and_log_probs(tiny):
    model, tok = tiny
    scorer = TransformersPolicy(model, tok, generate=False)
    prompt = chat_obs("a question", tokenizer=tok)
    responses = [Response("x", np.array([1000, 2000, tok.eos_token_id]))]
    out = scorer(prompt, responses)[0]
    n_prompt = len(out.tokens.prompt)

    dist, ids = scorer.get_dist(prompt, responses, mask="rlhf")
    assert isinstance(dist, MaskedCategorical) and ids.shape == (1, len(out.input_ids))
    log_prob = dist.log_prob(ids)
    log_prob.sum().backward()  # gradients reach the model
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0
    model.zero_grad()
    np.testing.assert_allclose(
        log_prob[0, n_prompt:].detach().numpy(), out.log_probs.response, atol=1e-5
    )
    assert torch.all(log_prob[0, :n_prompt] == 0) and torch.all(dist.entropy()[0, :n_prompt] == 0)

    sft, _ = scorer.get_dist(prompt, responses, mask="prompt")
    assert sft.mask[0].tolist() == [False] * n_prompt + [True] * 3
    generic, _ = scorer.get_dist(prompt, responses, mask="attention")
    assert generic.mask[0].tolist() == [False] + [True] * (len(out.input_ids) - 1)
    np.testing.assert_allclose(
        generic.log_prob(ids)[0].detach().numpy(), out.log_probs.full, atol=1e-5
    )
    custom = [np.arange(len(out.input_ids)) % 2 == 1]
    odd, _ = scorer.get_dist(prompt, responses, mask=custom)
    assert odd.mask[0].tolist() == custom[0].tolist()


def test_get_dist_left_pads_a_batch(tiny):
    model, tok = tiny
    scorer = TransformersPolicy(model, tok, generate=False)
    prompts = chat_obs("short", "a much longer question than the first one")
    responses = [np.array([5, 6]), np.array([7])]
    dist, ids = scorer.get_dist(prompts, responses, mask="assistant")
    outs = scorer(prompts, responses)
    width = ids.shape[1]
    assert width == max(len(o.input_ids) for o in outs)
    for row, out in enumerate(outs):
        np.testing.assert_array_equal(ids[row, width - len(out.input_ids) :].numpy(), out.input_ids)
        assert dist.mask[row].sum() == len(out.tokens.response)
        lp = dist.log_prob(ids)[row, width - len(out.input_ids) :].detach().numpy()
        np.testing.assert_allclose(
            lp[out.masks.all_assistant_mask], out.log_probs.response, atol=1e-5
        )


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


def test_get_dist_errors(tiny):
    model, tok = tiny
    policy = TransformersPolicy(model, tok)
    obs = chat_obs("a")
    with pytest.raises(RuntimeError, match="get_dist .* needs a log-prob policy"):
        policy.get_dist(obs, ["x"])
    scorer = policy.get_new_version(generate=False, input_mode="tokens")
    tokens = {"tokens": (np.array([1, 2, 3]),)}
    with pytest.raises(ValueError, match="mask must be one of .* got 'sft2'"):
        scorer.get_dist(tokens, mask="sft2")
    with pytest.raises(ValueError, match="mask='prompt' needs to know where the response starts"):
        scorer.get_dist(tokens, mask="prompt")
    with pytest.raises(ValueError, match="mask='assistant' needs to know the assistant's tokens"):
        scorer.get_dist(tokens, mask="assistant")
    with pytest.raises(
        ValueError, match=r"padded shape \(1, 3\), got dtype torch.bool and shape \(1, 2\)"
    ):
        scorer.get_dist(tokens, mask=torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(
        ValueError, match=r"mask\[0\] must be a bool array of the conversation's length 3"
    ):
        scorer.get_dist(tokens, mask=[np.ones(2, bool)])
