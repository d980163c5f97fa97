"""Credit from the state a turn was made in (issue 72): ``--branches`` grows each group with
episodes forked at its chains' turn boundaries, ``--advantage tree-grpo`` compares a turn with
the turns made in the same state, ``--advantage vine`` with VinePPO's Monte Carlo value of it.
A scripted env pays known rewards for known texts, so the tokens carry values written out here
apart from ``llm_gym.train.advantages``."""

import json
from dataclasses import replace

import numpy as np
import pytest
from train_fixture import keep_torch_threads  # noqa: F401  (fixtures)

from llm_gym.chat.containers import Response
from llm_gym.cli import main
from llm_gym.envs import (
    DatasetChatVectorEnv,
    EnvResponse,
    SessionChatEnv,
    make_textarena_vector_env,
)
from llm_gym.lm.loading import tiny_model
from llm_gym.train import GRPOConfig, GRPOTrainer
from llm_gym.train.advantages import tree_advantages, vine_advantages

TURNS, GROUPS, GROUP_SIZE, BRANCHES = 3, 2, 3, 2
ROWS = [{"query": "Say something, three times."}]


def paid(text, turn):
    return len(text) / 10 + turn / 4


class Scripted(SessionChatEnv):
    """Three turns, each paying ``paid`` of its text."""

    def env_response(self, conversation, text, item):
        return EnvResponse("Go on.", paid(text, conversation.turns), False)


class Recording(GRPOTrainer):
    """The trainer as it is; it keeps each update's input and each batch of episodes."""

    def update(self, sequences, masks, advantages, *args, **kwargs):
        self.given = (sequences, masks, advantages)
        return super().update(sequences, masks, advantages, *args, **kwargs)


def policy_of(tok, say):
    # Each prompt's text is say(stream, turn, prompt): the stream is the sub-env's (chains)
    # or past the sub-envs' (branches, continuations).
    def policy(batch):
        out = []
        for stream, prompt in zip(batch["env_index"], batch["tokens"], strict=True):
            text = tok.decode(prompt)
            words = say(stream, text.count("Go on."), text)
            ids = tok(words, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            out.append(Response(words, np.array(ids)))
        return out

    return policy


def trainer(tok, tmp_path, say, **changes):
    env = Scripted(ROWS, input_mode="tokens", tokenizer=tok, max_turns=TURNS, repeats=GROUP_SIZE,
                   observation_keys=("tokens", "history", "policy_mask"))  # fmt: skip
    envs = DatasetChatVectorEnv(env, num_envs=GROUPS * GROUP_SIZE)
    config = GRPOConfig(
        out=str(tmp_path / "run"), groups=GROUPS, group_size=GROUP_SIZE, max_new_tokens=16,
        eval_episodes=0, iterations=1, learning_rate=1e-2, progress=False, overlong_cache=0,
        **changes,
    )  # fmt: skip
    run = Recording(config, model=tiny_model(tok, seed=0), tokenizer=tok, env=envs)
    run.policy = policy_of(tok, say)
    played = run.feed.source.episodes
    run.batches = []
    run.feed.source.episodes = lambda n: run.batches.append(played(n)) or run.batches[-1]
    return run


def by_hand_tree(episodes, size, gamma):
    # Tree-GRPO written from the texts: two turns are one where the responses up to them are
    # the same; a turn's state is the responses before it.
    out = []
    for g in range(0, len(episodes), size):
        group = episodes[g : g + size]
        returns = []
        for e in group:
            r, later = [], 0.0
            for reward in reversed(e.turn_rewards):
                later = reward + gamma * later
                r.insert(0, later)
            returns.append(r)
        for episode in group:
            own = episode.branch["turn"] if episode.branch else 0
            row = []
            for t in range(len(episode.responses)):
                path = tuple(episode.responses[: t + 1])
                same = [returns[f][t] for f, o in enumerate(group)
                        if tuple(o.responses[: t + 1]) == path]  # fmt: skip
                before = episode.responses[:t]
                state = [(tuple(o.responses[: t + 1]), returns[f][t])
                         for f, o in enumerate(group)
                         if len(o.responses) > t and o.responses[:t] == before]  # fmt: skip
                if len({p for p, _ in state}) > 1:
                    ref = [v for _, v in state]
                else:
                    ref = [returns[f][t] for f, o in enumerate(group) if len(o.responses) > t]
                value = (np.mean(same) - np.mean(ref)) / (np.std(ref, ddof=1) + 1e-4)
                row.append(0.0 if t < own else value)
            out.append(row)
    return out


def test_branches_share_their_parents_turns_and_tree_grpo_compares_siblings(
    smollm2_tokenizer, tmp_path
):
    tok = smollm2_tokenizer

    def say(stream, turn, prompt):  # a text of each stream's own at each turn
        return "ab" * (1 + stream) + "c" * turn

    run = trainer(tok, tmp_path, say, branches=BRANCHES, advantage="tree-grpo", gamma=0.9)
    row = run.iteration(0)
    (batch,) = run.batches
    size = GROUP_SIZE + BRANCHES
    assert len(batch) == GROUPS * size
    chains = [e for e in batch if e.branch is None]
    assert len(chains) == GROUPS * GROUP_SIZE
    for g in range(GROUPS):
        group = batch[g * size : (g + 1) * size]
        assert [e.branch is None for e in group] == [True] * GROUP_SIZE + [False] * BRANCHES
        for branch in group[GROUP_SIZE:]:
            parent, turn = batch[branch.branch["of"]], branch.branch["turn"]
            assert g * size <= branch.branch["of"] < g * size + GROUP_SIZE and 1 <= turn < TURNS
            # The parent's turns before its branch point, token for token; its own after.
            assert branch.responses[:turn] == parent.responses[:turn]
            assert branch.responses[turn] != parent.responses[turn]
            # Its tokens up to the end of the parent's turn before, the parent's, not trained.
            shared = sum(parent.turn_tokens[:turn])
            end = np.flatnonzero(parent.segments[0].policy_mask)[shared - 1] + 1
            np.testing.assert_array_equal(
                branch.segments[0].ids[:end], parent.segments[0].ids[:end]
            )
            assert not branch.segments[0].policy_mask[:end].any()
            assert branch.turn_tokens[:turn] == [0] * turn
            assert branch.num_tokens == sum(branch.turn_tokens) == branch.policy_tokens
    sequences, masks, given = run.given
    expected = by_hand_tree(batch, size, 0.9)
    assert len(given) == len(batch)
    for i, (values, mask) in enumerate(zip(given, masks, strict=True)):
        policy = values[np.asarray(mask, bool)]
        np.testing.assert_allclose(
            policy, np.repeat(expected[i], batch[i].turn_tokens), rtol=1e-4, atol=1e-5
        )
    assert row["sampled_tokens"] == sum(e.num_tokens for e in batch)
    run.close()
    run.lock.release()


def test_vine_values_a_deterministic_policys_later_turns_at_their_own_return(
    smollm2_tokenizer, tmp_path
):
    # The first turn depends on the sub-env, the later ones only on the state: a continuation
    # from a state replays the episode, so V(s_t) = G_t for t >= 1 and every later turn's
    # advantage is 0; the first turn's is RLOO's, its return against the group's others'.
    tok = smollm2_tokenizer

    def say(stream, turn, prompt):
        return "ab" * (1 + stream % 4) if turn == 0 else "c" * (1 + len(prompt) % 3)

    run = trainer(tok, tmp_path, say, advantage="vine", vine_rollouts=3, gamma=1.0,
                  scale_rewards="none")  # fmt: skip
    row = run.iteration(0)
    (batch,) = run.batches
    assert len(batch) == GROUPS * GROUP_SIZE and all(e.branch is None for e in batch)
    sequences, masks, given = run.given
    for g in range(GROUPS):
        group = batch[g * GROUP_SIZE : (g + 1) * GROUP_SIZE]
        for e, episode in enumerate(group):
            returns = np.cumsum(episode.turn_rewards[::-1])[::-1]
            others = [sum(o.turn_rewards) for f, o in enumerate(group) if f != e]
            assert episode.turn_values[0] == pytest.approx(np.mean(others))
            np.testing.assert_allclose(episode.turn_values[1:], returns[1:], rtol=1e-6)
            first = returns[0] - np.mean(others)
            values = given[g * GROUP_SIZE + e][np.asarray(masks[g * GROUP_SIZE + e], bool)]
            expected = np.repeat([first, 0.0, 0.0], episode.turn_tokens)
            np.testing.assert_allclose(values, expected, rtol=1e-4, atol=1e-5)
    # Each later state of each episode, three continuations, each replaying its turns.
    replays = sum(3 * sum(e.turn_tokens[t:]) for e in batch for t in range(1, TURNS))
    assert row["sampled_tokens"] == sum(e.num_tokens for e in batch) + replays
    run.close()
    run.lock.release()


def test_the_formulas_against_small_cases():
    # Two chains and a branch of the first at turn 1: the branch's turn 1 and the first
    # chain's are siblings; the second chain's turn 1 has none (the group's turn-1 baseline).
    r = [[0.0, 1.0], [0.5, 0.0], [0.0, 0.0]]
    b = [None, None, {"of": 0, "turn": 1}]
    got = np.concatenate(tree_advantages(r, b, 3, gamma=1.0, scale="none"))
    np.testing.assert_allclose(got, [0.0, 0.5, 0.0, -1 / 3, 0.0, -0.5], atol=1e-6)
    # VinePPO: r_t + V(s_{t+1}) - V(s_t), the end worth 0; a NaN value (a parent's turn): 0.
    got = vine_advantages([[0.0, 1.0], [0.0, 0.0]], [[0.5, 0.8], [np.nan, 0.2]], 2, scale="none")
    np.testing.assert_allclose(np.concatenate(got), [0.3, 0.2, 0.0, -0.2], atol=1e-6)


CREDITS = {
    "tree-grpo": ["--branches", "2", "--advantage", "tree-grpo"],
    "vine": ["--advantage", "vine", "--vine-rollouts", "2"],
}


@pytest.mark.parametrize("credit", sorted(CREDITS))
def test_the_cli_trains_logs_its_episodes_and_resumes_exactly(tiny_dir, tmp_path, credit, capsys):
    branches = 2 if credit == "tree-grpo" else 0
    game = [
        "--model", tiny_dir, "--env", "LLMChat-TextArena-v0", "--env-arg",
        "game=GuessTheNumber-v0", "--env-arg", "max_turns=3", "--env-arg", "rewards=outcome",
        "--env-arg", "invalid_move_reward=-0.1", *CREDITS[credit],
        "--gamma", "0.9", "--log-episodes", "--groups", "2", "--group-size", "2",
        "--max-new-tokens", "4", "--save-every", "1", "--eval-episodes", "0", "--dtype",
        "float32", "--threads", "1", "--no-progress",
    ]  # fmt: skip
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert main(["train", "--out", str(whole), *game, "--iterations", "3"]) == 0
    assert main(["train", "--out", str(parts), *game, "--iterations", "2"]) == 0
    assert (
        main(["train", "--out", str(parts), "--resume", "--iterations", "3", "--no-progress"]) == 0
    )
    read = {out: [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
            for out in (whole, parts)}  # fmt: skip
    records, size = read[whole], 2 * (2 + branches)
    assert [r["episode"] for r in records] == list(range(3 * size))
    assert [r["iteration"] for r in records] == [i for i in range(3) for _ in range(size)]
    branched = [r for r in records if "branch" in r]
    assert len(branched) == 3 * 2 * branches
    for record in branched:
        parent = records[record["branch"]["of"]]
        turn = record["branch"]["turn"]
        assert parent["iteration"] == record["iteration"] and "branch" not in parent
        assert record["responses"][:turn] == parent["responses"][:turn]
        assert record["game_seed"] == parent["game_seed"]
    for a, b in zip(read[parts], records, strict=True):  # the same episodes, resumed or not
        assert a["responses"] == b["responses"] and a.get("branch") == b.get("branch")
        assert a.get("turn_values") == b.get("turn_values")
        assert ("turn_values" in a) == (credit == "vine")
    rows = {out: [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            for out in (whole, parts)}  # fmt: skip
    for a, b in zip(rows[parts], rows[whole], strict=True):
        assert a["sampled_tokens"] == b["sampled_tokens"] > 0
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    if credit != "tree-grpo":
        return
    # A budget of sampled tokens stops the run after the iteration that reaches it.
    budget, cut = rows[whole][0]["sampled_tokens"] + 1, tmp_path / "cut"
    flags = ["--max-sampled-tokens", str(budget), "--iterations", "3"]
    assert main(["train", "--out", str(cut), *game, *flags]) == 0
    summary = json.loads((cut / "summary.json").read_text())
    assert summary["iterations"] == 2 and not summary["interrupted"]
    assert summary["sampled_tokens"] == sum(r["sampled_tokens"] for r in rows[whole][:2])
    assert (cut / "checkpoint-2").is_dir()
    # Its budget spent, a resume with it trains no more.
    resume = ["train", "--out", str(cut), "--resume", "--iterations", "3", "--no-progress"]
    assert main(resume) == 2
    assert "--max-sampled-tokens above" in capsys.readouterr().err


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(advantage="tree-grpo"), "advantage 'tree-grpo' compares the turns made in one "
         "state, which only branches share: pass branches (--branches) >= 1"),
        (dict(vine_rollouts=4), "vine_rollouts (--vine-rollouts 4) sizes VinePPO's values, "
         "which only --advantage vine takes (got advantage 'grpo')"),
        (dict(branches=2, kl_coef=0.1), "--branches forks the run's own vector env where turns "
         "were made, which --kl-coef > 0 does not go with yet: drop one"),
        (dict(advantage="vine", asynchronous=True), "--advantage vine forks the run's own "
         "vector env where turns were made, which --async does not go with yet: drop one"),
        (dict(branches=-1), "branches"),
    ],
)  # fmt: skip
def test_what_the_options_need_is_one_line(changes, message):
    with pytest.raises(ValueError) as refused:
        GRPOConfig(**changes)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_single_turn_task_refuses_branches_before_it_trains(tiny_dir, tmp_path, capsys):
    args = ["train", "--model", tiny_dir, "--out", str(tmp_path / "run"), "--env-arg",
            "task=chain_sum", "--branches", "2", "--groups", "1", "--group-size", "2",
            "--eval-episodes", "0", "--no-progress"]  # fmt: skip
    assert main(args) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "llm-gym: error: LLMChat-ReasoningGym-v0 plays one turn an episode: --branches and "
        "--advantage vine fork episodes where a turn was made, which needs a multi-turn task "
        "(tools, a game, max_turns > 1)"
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_game_across_processes_refuses_a_kl_penalty_charged_in_its_envs(smollm2_tokenizer):
    # Each process's envs would score its turns with the sharded model, which every process
    # must call alike: refused in one line (the episodes themselves play in lock step).
    from llm_gym.train.play import check_vector_env

    keys = ("tokens", "history", "policy_mask")
    envs = make_textarena_vector_env(
        4,
        game="GuessTheNumber-v0",
        input_mode="tokens",
        observation_keys=keys,
        tokenizer=smollm2_tokenizer,
    )
    try:
        config = GRPOConfig(env="LLMChat-TextArena-v0", groups=2, group_size=4, kl_coef=0.1)
        check_vector_env(replace(config, kl_coef=0.0), envs, 2, True)  # lock step: fine
        with pytest.raises(ValueError) as refused:
            check_vector_env(config, envs, 2, True)
        assert str(refused.value) == (
            "LLMChat-TextArena-v0 plays more than one turn an episode (tools, a game, max_turns), "
            "whose KL penalty charged in the envs (--kl-coef > 0) a run across processes does "
            "not take yet: drop --kl-coef or run it in one process"
        )
    finally:
        envs.close()
