"""Credit per turn (issue 62): an episode keeps the reward of each of its turns and which
policy tokens each turn sampled; ``--advantage rebn`` and ``turn-grpo`` give each turn's tokens
their turn's value from the discounted returns ``G_t = r_t + gamma G_{t+1}``; with gamma 1 and
one reward at the end the trajectory-level numbers stay as they were."""

import json

import numpy as np
import pytest
import torch
from policy_fixture import scripted_policy

from llm_gym.envs import DatasetChatVectorEnv, EnvResponse, SessionChatEnv
from llm_gym.episodes import summarize
from llm_gym.lm.loading import tiny_model
from llm_gym.train import GRPOConfig, GRPOTrainer
from llm_gym.train.advantages import advantages, discounted_returns, turn_advantages

TURNS, GROUPS, GROUP_SIZE = 3, 2, 3
ROWS = [{"query": "Say something, three times."}]


def said(i, turn):
    # Sub-env i's words at a turn: lengths that differ within a group and between turns.
    return "ab" * (1 + (3 * i + 2 * turn + i * turn) % 5)


def paid(text, turn):
    # The scripted reward of a turn's text.
    return len(text) / 10 + turn / 4


class Scripted(SessionChatEnv):
    """Three turns; each pays ``paid`` of its text, or (``last_only``) nothing until the
    last, which pays what the three would have."""

    last_only = False

    def env_response(self, conversation, text, item):
        turn = conversation.turns  # the turns before this one
        if not self.last_only:
            return EnvResponse("Go on.", paid(text, turn), False)
        if turn < TURNS - 1:
            return EnvResponse("Go on.", 0.0, False)
        earlier = [m["content"] for m in conversation.history if m["role"] == "assistant"]
        total = sum(paid(said, t) for t, said in enumerate([*earlier, text]))
        return EnvResponse("Go on.", total, False)


def expected_rewards(last_only):
    # rewards[i][t] for each sub-env i, by the script, computed apart from the env.
    out = []
    for i in range(GROUPS * GROUP_SIZE):
        r = [paid(said(i, t), t) for t in range(TURNS)]
        out.append([0.0] * (TURNS - 1) + [sum(r)] if last_only else r)
    return out


class Recording(GRPOTrainer):
    """The trainer as it is; it keeps what each update was given."""

    def update(self, sequences, masks, advantages, *args, **kwargs):
        self.given = (sequences, masks, advantages)
        return super().update(sequences, masks, advantages, *args, **kwargs)


def trainer(tokenizer, tmp_path, name, last_only=False, **changes):
    env = Scripted(
        ROWS,
        input_mode="tokens",
        tokenizer=tokenizer,
        max_turns=TURNS,
        repeats=GROUP_SIZE,
        observation_keys=("tokens", "history", "policy_mask"),
    )
    env.last_only = last_only
    envs = DatasetChatVectorEnv(env, num_envs=GROUPS * GROUP_SIZE)
    config = GRPOConfig(
        out=str(tmp_path / name), groups=GROUPS, group_size=GROUP_SIZE, max_new_tokens=16,
        eval_episodes=0, iterations=1, learning_rate=1e-2, progress=False, overlong_cache=0,
        **changes,
    )  # fmt: skip
    model = tiny_model(tokenizer, seed=0)
    run = Recording(config, model=model, tokenizer=tokenizer, env=envs)

    def answer(i, prompt):
        return said(i, prompt.count("Go on."))

    run.policy = scripted_policy(tokenizer, answer)
    return run


def turn_tokens(tokenizer, i):
    # What sub-env i sampled at each turn: its words and the end-of-sequence token.
    return [
        len(tokenizer(said(i, t), add_special_tokens=False)["input_ids"]) + 1 for t in range(TURNS)
    ]


def by_hand(rewards, estimator, gamma, scale="group", eps=1e-4):
    # The formulas, written out apart from llm_gym.train.advantages.
    returns = []
    for r in rewards:
        g, later = [], 0.0
        for reward in reversed(r):
            later = reward + gamma * later
            g.insert(0, later)
        returns.append(g)
    if estimator == "rebn":
        flat = [g for e in returns for g in e]
        mean, std = np.mean(flat), np.std(flat, ddof=1)
        return [[(g - mean) / (std + eps) for g in e] for e in returns]
    out = []
    for start in range(0, len(returns), GROUP_SIZE):
        group = returns[start : start + GROUP_SIZE]
        for e in group:
            row = []
            for t, g in enumerate(e):
                column = [other[t] for other in group if len(other) > t]
                std = np.std(column, ddof=1) if len(column) > 1 else 0.0
                row.append((g - np.mean(column)) / (std + eps))
            out.append(row)
    return out


@pytest.mark.parametrize("estimator, gamma", [("rebn", 0.9), ("turn-grpo", 0.9), ("rebn", 1.0)])
def test_each_turns_tokens_carry_their_turns_value(smollm2_tokenizer, tmp_path, estimator, gamma):
    run = trainer(smollm2_tokenizer, tmp_path, "run", advantage=estimator, gamma=gamma)
    row = run.iteration(0)
    sequences, masks, given = run.given
    expected = by_hand(expected_rewards(False), estimator, gamma)
    assert len(given) == len(sequences) == GROUPS * GROUP_SIZE
    for i, (values, mask) in enumerate(zip(given, masks, strict=True)):
        assert values.shape == mask.shape and values.dtype == np.float32
        policy = values[np.asarray(mask, bool)]
        turns = np.repeat(expected[i], turn_tokens(smollm2_tokenizer, i))
        np.testing.assert_allclose(policy, turns, rtol=1e-5, atol=1e-5)
        assert not values[~np.asarray(mask, bool)].any()  # prompts and env messages: 0
    assert len({round(float(v), 6) for v in given[0][np.asarray(masks[0], bool)]}) == TURNS
    assert row["reward"] == pytest.approx(np.mean([sum(r) for r in expected_rewards(False)]))
    run.close()
    run.lock.release()


def test_episodes_keep_each_turns_reward_and_tokens(smollm2_tokenizer, tmp_path):
    run = trainer(smollm2_tokenizer, tmp_path, "run")
    episodes = run.feed.episodes(GROUPS * GROUP_SIZE)
    for i, episode in enumerate(episodes):
        assert episode.turn_rewards == pytest.approx(expected_rewards(False)[i])
        assert episode.reward == pytest.approx(sum(episode.turn_rewards))
        assert episode.turn_tokens == turn_tokens(smollm2_tokenizer, i)
        assert sum(episode.turn_tokens) == episode.policy_tokens
    record = episodes[0].record()
    assert json.loads(json.dumps(record["turn_rewards"])) == episodes[0].turn_rewards
    summary = summarize(episodes, 1.0)
    means = [np.mean([r[t] for r in expected_rewards(False)]) for t in range(TURNS)]
    assert summary.turn_rewards == pytest.approx(means)
    row = dict(summary.rows())["mean reward by turn"]
    assert row == ", ".join(f"{m:.3f}" for m in means)
    run.close()
    run.lock.release()


def test_gamma_one_and_a_reward_at_the_end_give_todays_numbers(smollm2_tokenizer, tmp_path):
    # Every episode three turns long, one reward at its end: turn t's returns are the
    # episodes' returns, so turn-level GRPO is GRPO, token for token and weight for weight.
    runs = {
        name: trainer(smollm2_tokenizer, tmp_path, name, last_only=True, advantage=name)
        for name in ("grpo", "turn-grpo")
    }
    rows = {name: run.iteration(0) for name, run in runs.items()}
    per_episode, per_token = runs["grpo"].given[2], runs["turn-grpo"].given[2]
    for value, tokens, mask in zip(per_episode, per_token, runs["grpo"].given[1], strict=True):
        # Each a token: GRPO's one value on every token of its episode.
        assert np.all(value == value[0])
        assert np.all(tokens[np.asarray(mask, bool)] == value[0])
    assert rows["grpo"]["loss"] == rows["turn-grpo"]["loss"]
    weights = [dict(run.model.named_parameters()) for run in runs.values()]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    for run in runs.values():
        run.close()
        run.lock.release()


def test_the_estimators_formulas():
    rewards = [[0.0, 1.0, 0.5], [1.0], [0.2, 0.2], [0.0, 0.0, 1.0]]
    for estimator in ("rebn", "turn-grpo"):
        for scale in ("group", "none"):
            ours = turn_advantages(rewards, 2, estimator, 0.9, scale)
            hand = by_groups(rewards, estimator, 0.9, scale)
            for a, b in zip(ours, hand, strict=True):
                np.testing.assert_allclose(a.numpy(), b, rtol=1e-5, atol=1e-6)
    # One turn an episode: today's ReBN, exactly.
    flat = torch.tensor([0.3, 1.0, 0.0, 0.7])
    single = torch.cat(turn_advantages([[r] for r in flat.tolist()], 2, "rebn"))
    assert torch.equal(single, advantages(flat, 2, "rebn"))
    assert discounted_returns([1.0, 0.0, 2.0], 0.5) == [1.5, 1.0, 2.0]
    with pytest.raises(ValueError, match="estimator must be one of"):
        turn_advantages(rewards, 2, "grpo")


def by_groups(rewards, estimator, gamma, scale):
    # by_hand for groups of 2, with scale "none" as a plain difference from turn t's mean.
    if scale == "group" or estimator == "rebn":
        global GROUP_SIZE
        size, GROUP_SIZE = GROUP_SIZE, 2
        try:
            return by_hand(rewards, estimator, gamma)
        finally:
            GROUP_SIZE = size
    returns = [[discounted_returns(r, gamma)[t] for t in range(len(r))] for r in rewards]
    out = []
    for start in range(0, len(returns), 2):
        group = returns[start : start + 2]
        for e in group:
            out.append([g - np.mean([o[t] for o in group if len(o) > t]) for t, g in enumerate(e)])
    return out


@pytest.mark.parametrize("gamma", ["0", "1.5", "-0.1"])
def test_gamma_outside_zero_to_one_is_one_line(gamma, capsys):
    from llm_gym.cli import main

    try:  # the parser's bound (above 0), or the config's (at most 1)
        code = main(["train", "--gamma", gamma, "--out", "x"])
    except SystemExit as exit:
        code = exit.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--gamma" in err and gamma in err and len(err.splitlines()) <= 2
    assert err.splitlines()[-1].startswith(("llm-gym: error:", "llm-gym train: error:"))
    with pytest.raises(ValueError, match=r"gamma \(--gamma\) must be in \(0, 1\], got 1.5"):
        GRPOConfig(gamma=1.5)
