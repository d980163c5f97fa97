"""LLM judges through vLLM (issue 41, item 2): a per-response and a group judge score real
responses through ``VLLMSampler`` (one server for this module, fp32 on the CPU, the default
model, greedy) exactly as through ``TransformersPolicy``: the same replies, the same scores,
one call per repeated (question, response), and ``stats.tokens`` the prompt and reply tokens.
Deselect with ``-m "not vllm"``; CI runs them."""

import copy

import numpy as np
import pytest
import torch

from llm_gym.policies import TransformersPolicy
from llm_gym.rubrics import (
    GROUP_TEMPLATE,
    GroupJudge,
    Judge,
    Part,
    Rubric,
    parse_group_scores,
    parse_score,
)

pytestmark = pytest.mark.vllm

REPLY_TOKENS = 3  # the judge's greedy reply after the "Score:" prefill: " 9", " 99", ...
TIE = 1e-2  # logits closer than this are a tie that float32 kernels may break either way
ITEMS = [
    {"query": "What is 2 + 3?", "answer": "5"},
    {"query": "Name a primary colour.", "answer": "red"},
    {"query": "What is the capital of France?", "answer": "Paris"},
    {"query": "What is 6 times 7?", "answer": "42"},
]
GROUPS = [
    ["2 + 3 = 5.", "It is 7.", "Five.", "I don't know."],
    ["Red.", "Green is a colour.", "Blue", "Purple"],
    ["Paris.", "London.", "The capital of France is Paris.", "Lyon"],
    ["42", "6 times 7 is 48.", "forty-two", "13"],
]
RESPONSES = [response for group in GROUPS for response in group]
RESPONSE_ITEMS = [item for item, group in zip(ITEMS, GROUPS, strict=True) for _ in group]
JUDGED = [0, 1, 2, 3, 12, 13, 14, 15]  # two questions' responses: replies in range and out
# The default template with a format example: the 135M model writes no score line of its own
# under the plain one (it repeats the prompt), but copies this example's four lines.
EXAMPLE_TEMPLATE = (
    GROUP_TEMPLATE
    + "\nAn example reply for 4 responses:\nResponse 1: 2\nResponse 2: 9\nResponse 3: 6\n"
    + "Response 4: 0"
)


@pytest.fixture(scope="module")
def served(vllm_default):
    """The judge model behind the test run's vLLM server: greedy, ``REPLY_TOKENS`` tokens a
    reply."""
    return vllm_default.with_settings(max_new_tokens=REPLY_TOKENS, temperature=0.0)


def longer(sampler, max_new_tokens):
    """``sampler`` (sharing its server) with a longer reply."""
    new = copy.copy(sampler)
    new.max_new_tokens = max_new_tokens
    return new


def transformers(default_model, max_new_tokens):
    model, tokenizer = default_model
    greedy = {"do_sample": False, "max_new_tokens": max_new_tokens}
    return TransformersPolicy(model, tokenizer, generate_kwargs=greedy)


class Recording:
    """A real sampler, with each batch's prompts and samples written down."""

    def __init__(self, sampler):
        self.sampler, self.batches, self.version = sampler, [], None

    def sample(self, prompts):
        samples = self.sampler.sample(prompts)
        self.batches.append((list(prompts), samples))
        return samples


def greedy_gaps(model, prompt, tokens):
    """How far below the best logit each of ``tokens`` was, fed after ``prompt`` to ``model``
    (teacher-forced, fp32), and the margin of the best over the runner-up at each step."""
    ids = torch.as_tensor(np.concatenate([prompt, tokens]), dtype=torch.long)[None]
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    top = logits.topk(2).values
    chosen = logits.gather(1, torch.as_tensor(tokens, dtype=torch.long)[:, None])[:, 0]
    return (top[:, 0] - chosen).tolist(), (top[:, 0] - top[:, 1]).tolist()


def test_a_judge_scores_through_vllm_as_through_transformers(served, default_model):
    model, tokenizer = default_model
    responses, items = [RESPONSES[k] for k in JUDGED], [RESPONSE_ITEMS[k] for k in JUDGED]
    recorded = Recording(served)
    scores, judges = {}, {}
    hf = transformers(default_model, REPLY_TOKENS)
    for name, sampler in (("vllm", recorded), ("transformers", hf)):
        judge = Judge(sampler, tokenizer, reference_field="answer", reply_prefix="Score:")
        scores[name] = Rubric([Part("judge", judge)]).score_batch(responses, items)
        assert judge.stats.calls == len(JUDGED) and judge.stats.errors == 0
        judges[name] = judge
    # vLLM's replies are greedy paths of the same weights: each token the best one up to
    # float32's differences between kernels. The 135M model's second digit is often a near tie
    # ("1" against "9" within 1e-3 on one CPU), which another CPU may break the other way; where
    # no step is a tie, vLLM writes transformers' reply.
    ((prompts, samples),) = recorded.batches
    paths = {tuple(prompt): sample.tokens for prompt, sample in zip(prompts, samples, strict=True)}
    prefill = tokenizer.encode("Score:", add_special_tokens=False)
    ties = 0
    for response, item, ours, theirs in zip(
        responses, items, scores["vllm"], scores["transformers"], strict=True
    ):
        chat = [{"role": "user", "content": judges["vllm"].prompt(response, item)}]
        prompt = (
            tokenizer.apply_chat_template(
                chat, add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
            + prefill
        )
        tokens = np.asarray(paths[tuple(prompt)])
        below, margins = greedy_gaps(model, np.asarray(prompt), tokens)
        assert 1 <= len(below) <= REPLY_TOKENS and max(below) <= TIE, (response, below)
        if min(margins) > TIE:
            assert ours == theirs, response
        ties += min(margins) <= TIE
    assert ties < len(JUDGED)  # most replies are clear of ties: the comparison means something
    for score in scores["vllm"]:
        reply = score.info["judge_reply"]
        value, why = parse_score(reply, 0, 10)
        assert reply.startswith("Score:") and score.reward == (0.0 if value is None else value)
        assert score.info.get("judge_error") == why


def test_a_group_judge_ranks_four_responses_through_vllm(served, default_model):
    tokenizer = default_model[1]
    for template, tokens in ((None, 8), (EXAMPLE_TEMPLATE, 24)):
        scores = {}
        for name, sampler in (
            ("vllm", longer(served, tokens)),
            ("transformers", transformers(default_model, tokens)),
        ):
            group = GroupJudge(
                sampler, tokenizer, template=template, reference_field="answer",
                reply_prefix="Response 1:",
            )  # fmt: skip
            rubric = Rubric([Part("rank", group, group=True)])
            scores[name] = rubric.score_group(GROUPS[0], [ITEMS[0]] * 4)
            assert group.stats.calls == 1 and group.stats.errors == 0
        assert scores["vllm"] == scores["transformers"]
        reply = scores["vllm"][0].info["group_judge_reply"]
        assert reply.startswith("Response 1:")
        assert all(score.info["group_judge_reply"] == reply for score in scores["vllm"])
        values, why = parse_group_scores(reply, 4, 0, 10)
        rewards = [score.reward for score in scores["vllm"]]
        assert rewards == (values or [0.0] * 4) and all(0 <= r <= 1 for r in rewards)
        assert all(score.info.get("group_judge_error") == why for score in scores["vllm"])
        if template is None:  # the plain prompt: the small model repeats it, no scores
            # (it echoes the prompt's next line, now the nonce-tagged response marker)
            assert values is None and why.startswith(("no score for response 1", "the score"))
            assert "response 1" in why
        else:  # the example's four lines, parsed
            assert rewards == [0.2, 0.9, 0.6, 0.0]


def test_a_repeated_question_and_response_costs_one_call(served, default_model):
    tokenizer = default_model[1]
    sampler = Recording(served)
    judge = Judge(sampler, tokenizer, reference_field="answer", reply_prefix="Score:")
    rubric = Rubric([Part("judge", judge)])
    first = rubric.score_batch(["It is 7.", "It is 7."], [ITEMS[0]] * 2)
    assert first[0] == first[1] and [len(prompts) for prompts, _ in sampler.batches] == [1]
    assert judge.stats.calls == 1 and judge.stats.cache_hits == 1
    assert rubric("It is 7.", ITEMS[0]) == first[0]  # later too: from the cache
    assert len(sampler.batches) == 1 and judge.stats.calls == 1 and judge.stats.cache_hits == 2
    rubric("It is 7.", ITEMS[1])  # another question: judged anew
    assert len(sampler.batches) == 2 and judge.stats.calls == 2


def test_the_judges_tokens_are_its_prompts_and_replies(served, default_model):
    tokenizer = default_model[1]
    sampler = Recording(served)
    judge = Judge(sampler, tokenizer, reference_field="answer", reply_prefix="Score:")
    responses, items = RESPONSES[:4], RESPONSE_ITEMS[:4]
    Rubric([Part("judge", judge)]).score_batch(responses, items)
    ((prompts, samples),) = sampler.batches
    prefill = len(tokenizer.encode("Score:", add_special_tokens=False))
    for prompt, response, item in zip(prompts, responses, items, strict=True):
        chat = [{"role": "user", "content": judge.prompt(response, item)}]
        ids = tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        assert len(prompt) == len(ids) + prefill
    assert all(1 <= len(s.tokens) <= REPLY_TOKENS for s in samples)
    expected = sum(len(p) for p in prompts) + sum(len(s.tokens) for s in samples)
    assert judge.stats.tokens == expected and judge.stats.calls == 4
    assert judge.stats.seconds > 0 and judge.stats.cache_hits == 0
