"""A KL wrapper refuses a scorer that tokenizes otherwise than the env (issue 43): it would
score the env's token ids as other tokens, 9-10 nats of KL a token, silently."""

import copy

import gymnasium as gym
import numpy as np
import pytest

from llm_gym import ChatEnv, Response, TransformersPolicy
from llm_gym.envs import DatasetChatEnv, DatasetChatVectorEnv
from llm_gym.wrappers import KLRewardWrapper, RetrieveKL, RetrieveLogProb
from llm_gym.wrappers import vector as vector_kl
from llm_gym.wrappers.kl import tokenizer_mismatch

GPT2_VS_SMOL = (
    "the env's is TokenizersBackend\\('.*smollm2.*'\\), {arg}'s GPT2Tokenizer\\('.*gpt2.*'\\), "
    "and the vocabularies differ: 49152 vs 50257 tokens, .* ids name other tokens "
    "\\(id 0 is '<\\|endoftext\\|>' vs '!'\\); eos_token_id 2 vs 50256; bos_token_id 1 vs "
    "50256; pad_token_id 2 vs 50256"
)


def scorer(model, tokenizer):
    return TransformersPolicy(model, tokenizer, input_mode="tokens", generate=False)


def smol_env(tokenizer):
    return ChatEnv("tokens", tokenizer=tokenizer, query="What is 2+2?", max_turns=1)


def smol_vector_env(tokenizer, num_envs=2):
    rows = [{"query": "What is 2+2?"}, {"query": "Hi"}]
    return DatasetChatVectorEnv(DatasetChatEnv(rows, input_mode="tokens", tokenizer=tokenizer),
                                num_envs)  # fmt: skip


def test_every_kl_wrapper_refuses_a_reference_with_another_tokenizer(
    tiny, tiny_gpt2, smollm2_tokenizer
):
    gpt2_ref = scorer(*tiny_gpt2)
    smol = smollm2_tokenizer
    cases = [
        (lambda: KLRewardWrapper(smol_env(smol), gpt2_ref, coef=0.1), "ref_model"),
        (lambda: RetrieveKL(smol_env(smol), None, gpt2_ref), "ref_model"),
        (lambda: RetrieveLogProb(smol_env(smol), gpt2_ref), "model"),
        (lambda: vector_kl.KLRewardWrapper(smol_vector_env(smol), gpt2_ref), "ref_model"),
        (lambda: vector_kl.RetrieveLogProb(smol_vector_env(smol), gpt2_ref), "model"),
        # Through Gymnasium's own wrappers and a SyncVectorEnv of sub-envs.
        (lambda: KLRewardWrapper(gym.wrappers.TimeLimit(smol_env(smol), 3), gpt2_ref), "ref_model"),
        (
            lambda: vector_kl.KLRewardWrapper(
                gym.vector.SyncVectorEnv([lambda: smol_env(smol)] * 2), gpt2_ref
            ),
            "ref_model",
        ),
    ]
    for make, argument in cases:
        with pytest.raises(ValueError, match=f"{argument} must use the env's tokenizer") as error:
            make()
        assert error.match(GPT2_VS_SMOL.format(arg=argument))


def test_a_generator_with_another_tokenizer_is_refused_too(tiny, tiny_gpt2, smollm2_tokenizer):
    smol_scorer, gpt2_scorer = scorer(*tiny), scorer(*tiny_gpt2)
    with pytest.raises(ValueError, match="gen_model and ref_model must share a tokenizer"):
        RetrieveKL(smol_env(smollm2_tokenizer), gpt2_scorer, smol_scorer)
    # Both scorers agree with each other but not with the env.
    with pytest.raises(ValueError, match="gen_model must use the env's tokenizer"):
        RetrieveKL(smol_env(smollm2_tokenizer), gpt2_scorer, scorer(*tiny_gpt2))


def test_same_vocabulary_other_special_tokens_is_refused(tiny, smollm2_tokenizer):
    model, tok = tiny
    other_eos = copy.deepcopy(tok)
    other_eos.eos_token = "<|endoftext|>"  # id 0, where the env's eos is <|im_end|>, id 2
    assert tokenizer_mismatch(tok, other_eos) == "eos_token_id 2 vs 0"
    with pytest.raises(ValueError, match="and eos_token_id 2 vs 0$"):
        KLRewardWrapper(smol_env(tok), scorer(model, other_eos))
    # A pad id is compared where both tokenizers set one.
    no_pad = copy.deepcopy(tok)
    no_pad.pad_token = None
    assert tokenizer_mismatch(tok, no_pad) is None
    assert tokenizer_mismatch(tok, no_pad, pad=True) == "pad_token_id 2 vs None"
    other_pad = copy.deepcopy(tok)
    other_pad.pad_token = "<|endoftext|>"
    assert tokenizer_mismatch(tok, other_pad) == "pad_token_id 2 vs 0"
    # A token added to one copy: the vocabularies differ, by that token.
    added = copy.deepcopy(tok)
    added.add_tokens(["<extra>"])
    assert tokenizer_mismatch(tok, added) == (
        "the vocabularies differ: 49152 vs 49153 tokens, 1 ids name other tokens "
        "(id 49152 is None vs '<extra>')"
    )


def test_a_reference_with_an_equal_tokenizer_still_charges_the_kl(tiny, smollm2_tokenizer):
    model, tok = tiny
    twin = copy.deepcopy(tok)  # another object with the same vocabulary and ids
    assert twin is not tok and tokenizer_mismatch(tok, twin) is None
    env = KLRewardWrapper(smol_env(tok), scorer(model, twin), coef=0.5)
    obs, _ = env.reset(seed=0)
    tokens = np.asarray(tok("4")["input_ids"])
    scored = scorer(model, tok)(obs, Response("4", tokens), response_only=True)
    _, reward, terminated, _, info = env.step(Response("4", tokens, scored.log_probs.response))
    # The same model on both sides: no KL, the reward as it was.
    np.testing.assert_allclose(info["kl"], 0.0, atol=1e-5)
    assert terminated and reward == pytest.approx(0.0, abs=1e-5)


def test_an_env_without_a_tokenizer_has_nothing_to_compare(tiny_gpt2):
    # History mode without a tokenizer: the scorer renders the history itself.
    env = KLRewardWrapper(ChatEnv(query="hi", max_turns=1), scorer(*tiny_gpt2))
    assert env.unwrapped.tokenizer is None
