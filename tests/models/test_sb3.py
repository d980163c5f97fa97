"""LLMActorCriticPolicy with stable-baselines3: logits against plain forwards, value heads,
save/load round trips, learning on the copy task (scripts/train_sb3_ppo.py), errors."""

import functools
import importlib.util
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3 import PPO
from transformers import Gemma2Config, Gemma2ForCausalLM

from llm_gym.envs import DatasetChatEnv, TokenEnv
from llm_gym.lm.loading import tiny_model
from llm_gym.policies import LLMActorCriticPolicy
from llm_gym.policies.sb3 import last_positions

SCRIPT = Path(__file__).parents[2] / "scripts" / "train_sb3_ppo.py"


def load_script():
    spec = importlib.util.spec_from_file_location("train_sb3_ppo", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def script():
    return load_script()


@pytest.fixture()
def one_thread():
    # A 2-layer model spends more time synchronising threads than computing (and the
    # training script sets the count itself): one thread here, the session's count after.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def gpt2_env(tok, rows=({"query": "Repeat: 7"}, {"query": "Say hello to the world"})):
    task = DatasetChatEnv(list(rows), input_mode="tokens", tokenizer=tok, seed=0)
    return TokenEnv(task, max_new_tokens=4, max_prompt_length=32)


def policy_for(env, **kwargs):
    return LLMActorCriticPolicy(env.observation_space, env.action_space, lambda _: 1e-3, **kwargs)


def as_tensors(policy, obs):
    return policy.obs_to_tensor(obs)[0]


def batch(env, n=3):
    obs = [env.reset(seed=i)[0] for i in range(n)]
    env.step(40)  # a second row with a generated token (one fewer pad)
    obs.append(env.step(41)[0])
    return {key: np.stack([o[key] for o in obs]) for key in obs[0]}


# -- the policy's numbers -----------------------------------------------------------------


def test_action_logits_are_the_lm_at_the_last_real_token(gpt2_tokenizer):
    env = gpt2_env(gpt2_tokenizer)
    model = tiny_model(gpt2_tokenizer, seed=0)
    policy = policy_for(env, model=model)
    obs = batch(env)
    with torch.no_grad():
        dist = policy.get_distribution(as_tensors(policy, obs)).distribution
        for row in range(len(obs["input_ids"])):
            real = torch.as_tensor(obs["input_ids"][row][obs["attention_mask"][row] == 1])[None]
            expected = torch.log_softmax(model(real).logits[0, -1], -1)
            torch.testing.assert_close(dist.logits[row], expected, atol=1e-4, rtol=1e-4)


def test_last_positions_left_and_right_padding():
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]])
    assert last_positions(mask).tolist() == [3, 2, 0]


def test_values_start_at_zero_and_use_the_value_model(gpt2_tokenizer):
    env = gpt2_env(gpt2_tokenizer)
    obs = batch(env)
    shared = policy_for(env, model=tiny_model(gpt2_tokenizer))
    critic = tiny_model(gpt2_tokenizer, seed=5, hidden_size=32)
    separate = policy_for(env, model=tiny_model(gpt2_tokenizer), value_model=critic)
    assert separate.value_head.in_features == 32
    with torch.no_grad():
        for policy in (shared, separate):
            assert policy.predict_values(as_tensors(policy, obs)).tolist() == [[0.0]] * 4
        separate.value_head.weight.fill_(1.0)
        values = separate.predict_values(as_tensors(separate, obs))[:, 0]
        for row, value in enumerate(values):
            real = torch.as_tensor(obs["input_ids"][row][obs["attention_mask"][row] == 1])[None]
            expected = critic.model(real).last_hidden_state[0, -1].sum()
            assert float(value) == pytest.approx(float(expected), abs=1e-3)
        _, forward_values, _ = separate(as_tensors(separate, obs))
        torch.testing.assert_close(forward_values[:, 0], values)


def test_allowed_token_ids_restrict_the_actions(gpt2_tokenizer):
    env = gpt2_env(gpt2_tokenizer)
    allowed = [15, 16, gpt2_tokenizer.eos_token_id]
    policy = policy_for(env, model=tiny_model(gpt2_tokenizer), allowed_token_ids=allowed)
    obs = as_tensors(policy, batch(env))
    with torch.no_grad():
        probs = policy.get_distribution(obs).distribution.probs
        actions, _, log_prob = policy(obs)
        _, eval_log_prob, entropy = policy.evaluate_actions(obs, actions)
    assert probs[:, allowed].sum(-1).tolist() == pytest.approx([1.0] * 4)
    assert set(actions.tolist()) <= set(allowed)
    torch.testing.assert_close(log_prob, eval_log_prob)
    assert torch.isfinite(entropy).all() and (entropy <= np.log(3) + 1e-5).all()


def test_lm_stays_in_eval_mode_and_frozen_parameters_are_not_optimised(gpt2_tokenizer):
    env = gpt2_env(gpt2_tokenizer)
    model = tiny_model(gpt2_tokenizer, arch="gpt2")  # GPT-2 has dropout
    model.get_input_embeddings().weight.requires_grad_(False)
    policy = policy_for(env, model=model)
    policy.set_training_mode(True)
    assert policy.training and not model.training
    optimised = {id(p) for group in policy.optimizer.param_groups for p in group["params"]}
    assert id(model.get_input_embeddings().weight) not in optimised
    assert id(policy.value_head.weight) in optimised


# -- save and load ------------------------------------------------------------------------


def assert_same_policy(agent, loaded, obs):
    tensors = as_tensors(agent.policy, obs)
    with torch.no_grad():
        torch.testing.assert_close(
            agent.policy.get_distribution(tensors).distribution.probs,
            loaded.policy.get_distribution(tensors).distribution.probs,
            rtol=0,
            atol=0,
        )
        torch.testing.assert_close(
            agent.policy.predict_values(tensors), loaded.policy.predict_values(tensors)
        )
    np.testing.assert_array_equal(
        agent.predict(obs, deterministic=True)[0], loaded.predict(obs, deterministic=True)[0]
    )


def trained_agent(script, model_spec):
    tok = script.char_tokenizer()
    env = script.make_env(tok, seed=0)
    agent = PPO(
        LLMActorCriticPolicy,
        env,
        n_steps=64,
        batch_size=32,
        n_epochs=2,
        seed=0,
        policy_kwargs={"model": model_spec(tok)},
    )
    before = {k: v.clone() for k, v in agent.policy.state_dict().items()}
    agent.learn(64)
    changed = any(not torch.equal(before[k], v) for k, v in agent.policy.state_dict().items())
    assert changed  # the round trip below is of trained weights, not of the initial ones
    return agent, env


@pytest.mark.parametrize("form", ["object", "factory", "folder"])
def test_ppo_save_load_gives_the_same_policy(script, tmp_path, one_thread, form):
    def spec(tok):
        if form == "object":
            return tiny_model(tok, seed=0)
        if form == "factory":
            return functools.partial(tiny_model, vocab_size=len(tok), seed=0)
        tiny_model(tok, seed=0).save_pretrained(tmp_path / "lm")
        tok.save_pretrained(tmp_path / "lm")
        return str(tmp_path / "lm")

    agent, env = trained_agent(script, spec)
    agent.save(tmp_path / "agent.zip")
    loaded = PPO.load(tmp_path / "agent.zip", env=env)
    resets = [env.reset(seed=i)[0] for i in range(5)]
    obs = {key: np.stack([o[key] for o in resets]) for key in resets[0]}
    assert_same_policy(agent, loaded, obs)
    assert loaded.policy.model is not agent.policy.model
    if form != "object":  # only a name is pickled: the file holds the weights once
        size = (tmp_path / "agent.zip").stat().st_size
        params = sum(p.numel() for p in agent.policy.parameters()) * 4
        assert size < 3.5 * params  # parameters + Adam's two moments, no pickled model


def test_policy_only_save_load(script, tmp_path, one_thread):
    agent, env = trained_agent(script, lambda tok: tiny_model(tok, seed=0))
    agent.policy.save(tmp_path / "policy.pt")
    policy = LLMActorCriticPolicy.load(tmp_path / "policy.pt")
    obs, _ = env.reset(seed=0)
    tensors = as_tensors(policy, obs)
    with torch.no_grad():
        torch.testing.assert_close(
            policy.get_distribution(tensors).distribution.probs,
            agent.policy.get_distribution(tensors).distribution.probs,
        )


# -- learning -----------------------------------------------------------------------------


@pytest.mark.slow
def test_ppo_learns_the_copy_task(script, one_thread):
    """The shortened training run: from ~0.02 (random) to ~0.3-0.5 at 4096 steps (seeds 0-5
    gave rises of 0.31-0.46), so a rise of 0.2 is a wide margin."""
    result = script.main(["--timesteps", "4096", "--seed", "0", "--eval-episodes", "100"])
    assert result["before"] < 0.1
    assert result["after"] - result["before"] >= 0.2


# -- errors -------------------------------------------------------------------------------


def test_bad_spaces_and_models(gpt2_tokenizer):
    env = gpt2_env(gpt2_tokenizer)
    model = tiny_model(gpt2_tokenizer)
    box = gym.spaces.Box(0, 1, (4,))
    with pytest.raises(TypeError, match="observation_space must be a Dict with 'input_ids'"):
        LLMActorCriticPolicy(box, env.action_space, lambda _: 1e-3, model=model)
    with pytest.raises(TypeError, match="action_space must be Discrete"):
        LLMActorCriticPolicy(env.observation_space, box, lambda _: 1e-3, model=model)
    uneven = gym.spaces.Dict(
        {"input_ids": gym.spaces.Box(0, 9, (4,)), "attention_mask": gym.spaces.Box(0, 1, (5,))}
    )
    with pytest.raises(ValueError, match="must be 1-D of one length"):
        LLMActorCriticPolicy(uneven, env.action_space, lambda _: 1e-3, model=model)
    with pytest.raises(ValueError, match="LM head has 100 outputs but the action space has 50257"):
        policy_for(env, model=tiny_model(vocab_size=100))
    with pytest.raises(TypeError, match="model must be a causal LM with an LM head"):
        policy_for(env, model=model.model)
    with pytest.raises(TypeError, match="model must be a transformers model, a local model folder"):
        policy_for(env, model=3)
    with pytest.raises(TypeError, match="value_model must give a transformers model, got str"):
        policy_for(env, model=model, value_model=lambda: "critic")
    with pytest.raises(FileNotFoundError, match="is not a readable folder"):
        policy_for(env, model="/nonexistent/model")
    with pytest.raises(ValueError, match="allowed_token_ids must be a non-empty list"):
        policy_for(env, model=model, allowed_token_ids=[0, 50257])
    with pytest.raises(ValueError, match="use_sde must be False"):
        policy_for(env, model=model, use_sde=True)


def test_models_that_post_process_logits_are_refused(gpt2_tokenizer):
    env = gpt2_env(gpt2_tokenizer)
    config = Gemma2Config(
        vocab_size=50257,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        final_logit_softcapping=0.01,
    )
    with pytest.raises(ValueError, match="post-processes its logits beyond its LM head"):
        policy_for(env, model=Gemma2ForCausalLM(config))


def test_empty_observation_rows_are_refused(gpt2_tokenizer):
    env = gpt2_env(gpt2_tokenizer)
    policy = policy_for(env, model=tiny_model(gpt2_tokenizer))
    obs, _ = env.reset(seed=0)
    obs["attention_mask"][:] = 0
    with pytest.raises(ValueError, match="attention_mask is all 0"):
        policy.predict(obs)
