"""The seams: a free import, tasks as data plus a reward, the scorer protocol, one signature
for single-env and vector KL wrappers, the token env over any task, the info stacker."""

import inspect
import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

import llm_gym
from llm_gym.envs import DatasetChatEnv, TaskScore
from llm_gym.envs.vector import batch_infos
from llm_gym.lm import forward_logits, keeps_logits
from llm_gym.lm.loading import tiny_model
from llm_gym.samplers import check_scorer, is_scorer, response_log_probs
from llm_gym.wrappers import kl as single_kl
from llm_gym.wrappers import vector as vector_kl

HEAVY = ("torch", "transformers", "datasets")
ROWS = [{"q": "2+2?", "a": "4"}, {"q": "3+3?", "a": "6"}]


def loaded_after(code: str) -> list[str]:
    report = f"import json, sys\nprint(json.dumps([m for m in {HEAVY} if m in sys.modules]))"
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            f"{code}\n{report}",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_llm_gym_loads_nothing_heavy():
    assert loaded_after("import llm_gym") == []
    # A chat env without a tokenizer needs none of them either, through gym.make and a step.
    code = "import gymnasium as gym, llm_gym\nenv = gym.make('LLMChat-v0', query='hi')\n"
    assert loaded_after(code + "env.reset(seed=0); env.step('x')") == []
    # Names load on first use, and unknown ones fail as attributes do.
    assert "torch" in loaded_after("import llm_gym\nllm_gym.TransformersPolicy")
    with pytest.raises(AttributeError, match="module 'llm_gym' has no attribute 'Nope'"):
        llm_gym.Nope  # noqa: B018


# -- tasks as data plus a reward -------------------------------------------------------


def exact_match(response, sample):
    right = response.strip() == sample["a"]
    return float(right), {"expected": sample["a"]}


def test_reward_value_scores_each_step_with_its_sample():
    env = DatasetChatEnv(ROWS, field_map={"q": "query"}, reward=exact_match, shuffle=False)
    obs, info = env.reset(seed=0)
    assert obs["history"][-1]["content"] == "2+2?" and info == {"a": "4"}
    obs, reward, terminated, truncated, info = env.step(" 4 ")
    assert (reward, terminated, truncated, info["expected"]) == (1.0, True, False, "4")
    assert info["item"] == {"query": "2+2?", "a": "4"}  # the ended step names its item
    env.reset()
    _, reward, terminated, truncated, info = env.step("5")
    assert (reward, terminated, truncated, info["expected"]) == (0.0, True, False, "6")


def test_answered_decides_the_end_of_a_multi_turn_episode():
    def only_numbers_answer(response, sample):
        answered = response.isdigit()
        return TaskScore(float(response == sample["a"]), {"n": len(response)}, answered)

    env = DatasetChatEnv(
        ROWS, field_map={"q": "query"}, reward=only_numbers_answer, shuffle=False, max_turns=3
    )
    env.reset(seed=0)
    assert env.step("let me think")[1:] == (0.0, False, False, {"n": 12})
    _, reward, terminated, truncated, info = env.step("4")
    assert (reward, terminated, truncated, info["n"]) == (1.0, True, False, 1)
    env.reset()
    # A plain (reward, info) pair counts as an answer.
    plain = DatasetChatEnv(ROWS, field_map={"q": "query"}, reward=exact_match, max_turns=3)
    plain.reset(seed=0)
    assert plain.step("no")[2] is True


def test_bad_reward_arguments_and_results_are_named():
    with pytest.raises(TypeError, match="reward must be a function reward\\(response_text, "):
        DatasetChatEnv(ROWS, field_map={"q": "query"}, reward="exact")
    with pytest.raises(TypeError, match="takes its queries from the dataset, got query="):
        DatasetChatEnv(ROWS, field_map={"q": "query"}, query="hi")
    env = DatasetChatEnv(ROWS, field_map={"q": "query"}, reward=lambda r, s: 1.0)
    env.reset(seed=0)
    with pytest.raises(
        TypeError, match="reward must return \\(reward, info\\) or a TaskScore, got "
    ):
        env.step("4")


def test_gsm8k_is_a_dataset_env_with_the_gsm8k_task():
    rows = [{"question": "9*2?", "answer": "9*2=18\n#### 18"}]
    env = gym.make("LLMChat-GSM8K-v0", dataset=rows, max_turns=2)
    assert type(env.unwrapped) is DatasetChatEnv
    env.reset(seed=0)
    # No answer: the episode goes on; a wrong answer ends it with TorchRL's 0.1.
    assert env.step("<think>hmm</think>")[1:3] == (0.0, False)
    assert env.step("<answer>17</answer>")[1:3] == (0.1, True)
    custom = gym.make("LLMChat-GSM8K-v0", dataset=rows, system_prompt="Answer.")
    assert custom.reset(seed=0)[0]["history"][0] == {"role": "system", "content": "Answer."}


# -- the scorer protocol ---------------------------------------------------------------


class EchoScorer:
    """Scores every response token -1.0; counts the calls."""

    generate = False

    def __init__(self, outputs=None):
        self.calls, self.outputs = [], outputs

    def __call__(self, obs, responses=None, *, response_only=False):
        self.calls.append(response_only)
        batch = responses if isinstance(responses, list) else [responses]
        outs = [
            type("Out", (), {"log_probs": llm_gym.LogProbs(response=-np.ones(len(r.tokens)))})
            for r in batch
        ]
        outs = outs if self.outputs is None else outs[: self.outputs]
        return outs if isinstance(responses, list) else outs[0]


def test_scorer_protocol_and_its_one_validation():
    scorer = EchoScorer()
    assert is_scorer(scorer) and check_scorer(scorer, "ref_model") is scorer
    model = tiny_model(vocab_size=16)
    assert not is_scorer(model)  # a transformers model's generate is a method
    generating = type("G", (), {"generate": True, "__call__": lambda self, *a, **k: None})()
    with pytest.raises(ValueError, match="ref_model must score responses: .* got G in generate"):
        check_scorer(generating, "ref_model")
    with pytest.raises(ValueError, match="gen_model must score responses: .* got int in not a"):
        check_scorer(3, "gen_model")
    padded = EchoScorer()
    padded.pad_output = True
    with pytest.raises(ValueError, match="model must return one unpadded output .*pad_output=True"):
        check_scorer(padded, "model")


def test_response_log_probs_asks_for_the_response_only_and_checks_the_count():
    responses = [llm_gym.Response("ab", [1, 2]), llm_gym.Response("c", [3])]
    scorer = EchoScorer()
    got = response_log_probs(scorer, {"tokens": ([0], [0])}, responses, batched=True)
    assert [g.tolist() for g in got] == [[-1.0, -1.0], [-1.0]] and got[0].dtype == np.float32
    assert scorer.calls == [True]
    with pytest.raises(ValueError, match="returned 1 outputs for 2 responses"):
        response_log_probs(EchoScorer(outputs=1), {}, responses, batched=True)


# -- one signature for the single-env and vector KL wrappers ---------------------------


@pytest.mark.parametrize(
    "name", ["RetrieveLogProb", "KLComputation", "RetrieveKL", "KLRewardWrapper"]
)
def test_vector_wrappers_take_the_single_env_signature(name):
    single, vector = getattr(single_kl, name), getattr(vector_kl, name)
    params = [list(inspect.signature(w).parameters.values())[1:] for w in (single, vector)]
    assert params[0] == params[1]  # every argument but env, a vector env there


def test_vector_wrapper_arguments_fail_and_bind_as_the_single_env_ones():
    rows = [{"query": "hi"}, {"query": "yo"}]
    envs = llm_gym.DatasetChatVectorEnv(DatasetChatEnv(rows), 2)
    scorer = EchoScorer()
    with pytest.raises(TypeError, match="unexpected keyword argument 'cof'"):
        vector_kl.KLRewardWrapper(envs, scorer, cof=0.1)
    with pytest.raises(ValueError, match="estimator must be one of \\['k1', 'k2', 'k3'\\]"):
        vector_kl.KLRewardWrapper(envs, scorer, estimator="k9")
    wrapped = vector_kl.KLRewardWrapper(envs, scorer, 0.3, estimator="k3")
    assert wrapped.env.env.model is scorer  # the reference's RetrieveLogProb, under the charge
    assert (wrapped.coef, wrapped.charge.estimator, wrapped.charge.ref_key) == (
        0.3,
        "k3",
        "ref_log_probs",
    )


def test_retrieve_kl_passes_its_keys_to_the_retrievers():
    env = single_kl.RetrieveKL(
        llm_gym.ChatEnv(query="hi"), None, EchoScorer(), ref_key="theirs", coef=0.5
    )
    assert env.env.env.log_prob_key == "theirs" and env.charge.ref_key == "theirs"
    obs, _ = env.reset(seed=0)
    _, reward, _, _, info = env.step(llm_gym.Response("x", [5, 6], [-0.5, -0.5]))
    # k1 = log p - log q = -0.5 - (-1.0) per token; penalty 0.5 * (0.5 + 0.5).
    assert info["theirs"].tolist() == [-1.0, -1.0] and reward == pytest.approx(-0.5)


# -- the token env over any registered task ---------------------------------------------


def test_token_env_splits_its_arguments_from_the_task(gpt2_tokenizer):
    rows = [{"question": "9*2?", "answer": "#### 18"}]
    env = gym.make(
        "LLMToken-GSM8K-v0",
        tokenizer=gpt2_tokenizer,
        max_new_tokens=3,
        max_prompt_length=160,
        dataset=rows,
        repeats=2,
    )
    assert env.unwrapped.max_new_tokens == 3 and env.unwrapped.length == 163
    assert env.unwrapped.task_env.unwrapped.repeats == 2
    with pytest.raises(TypeError, match="token-level LLMChat-GSM8K-v0 sets max_turns itself"):
        gym.make("LLMToken-GSM8K-v0", tokenizer=gpt2_tokenizer, dataset=rows, max_turns=2)


# -- lm and info stacking ----------------------------------------------------------------


def test_forward_logits_keeps_the_last_positions_with_or_without_logits_to_keep():
    model = tiny_model(vocab_size=32)
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert keeps_logits(model)
    full = forward_logits(model, ids, mask)
    assert full.shape == (2, 5, 32)
    torch.testing.assert_close(forward_logits(model, ids, mask, keep=2), full[:, -2:])

    class NoKeep(torch.nn.Module):  # a forward without logits_to_keep: sliced afterwards
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, input_ids, attention_mask, position_ids, use_cache):
            return self.inner(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=use_cache,
            )

    assert not keeps_logits(NoKeep())
    torch.testing.assert_close(forward_logits(NoKeep(), ids, mask, keep=2), full[:, -2:])


def test_batch_infos_keeps_ragged_arrays_per_env():
    info = batch_infos([{"kl": np.zeros(3, np.float32), "p": 0.5}, {"kl": np.ones(1), "p": 1.5}])
    assert info["kl"].dtype == object and [a.shape for a in info["kl"]] == [(3,), (1,)]
    assert info["p"].tolist() == [0.5, 1.5] and info["_kl"].tolist() == [True, True]


# -- the layers: every import of llm_gym points down -----------------------------------

# Top-level module or package of llm_gym -> its layer; an import may only point to a lower one.
LAYERS = {
    "_lazy": 0, "checks": 0, "seeding": 0, "spaces": 0,
    "chat": 1, "sources": 1, "tools": 1, "games": 1, "servers": 1, "options": 1,
    "lm": 2, "rewards": 2,
    "samplers": 3,
    "rubrics": 4,
    "tasks": 5,
    "envs": 6, "policies": 6,
    "wrappers": 7, "episodes": 7,
    "agents": 8, "torchrl": 8, "run": 8,
    "train": 9,
    "integrations": 10,
    "cli": 11,
    "__main__": 12,  # the entry point: nothing imports it
}  # fmt: skip


def llm_gym_imports() -> list[tuple[str, str, str]]:
    """(importing file, its unit, imported unit) for every import of llm_gym inside it,
    function-level imports included."""
    import ast
    from pathlib import Path

    root = Path(llm_gym.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        unit = relative.parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] == "llm_gym" and len(parts) > 1 and parts[1] != unit:
                    found.append((str(relative), unit, parts[1]))
    return found


def test_every_import_points_down_a_layer():
    imports = llm_gym_imports()
    units = {unit for _, unit, _ in imports} | {target for *_, target in imports}
    assert units - {"__init__"} <= set(LAYERS), f"units without a layer: {units - set(LAYERS)}"
    upward = [
        f"{path}: {unit} (layer {LAYERS[unit]}) imports {target} (layer {LAYERS[target]})"
        for path, unit, target in imports
        if unit != "__init__" and LAYERS[target] >= LAYERS[unit]
    ]
    assert upward == []


# -- precise public signatures ------------------------------------------------------------


def public_annotations() -> list[tuple[str, str]]:
    """(place, annotation source) of every parameter and return annotation of the public
    functions, methods and classes' methods in llm_gym's public modules."""
    import ast
    from pathlib import Path

    root = Path(llm_gym.__file__).parent
    found = []

    def visit(body: list, path: Path, owner: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, path, f"{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name.startswith("_") and node.name not in ("__init__", "__call__"):
                    continue
                args = node.args
                params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
                params += [p for p in (args.vararg, args.kwarg) if p is not None]
                annotations = [(p.arg, p.annotation) for p in params if p.annotation]
                annotations += [("return", node.returns)] if node.returns else []
                for name, annotation in annotations:
                    place = f"{path.relative_to(root)}:{node.lineno} {owner}{node.name}({name})"
                    found.append((place, ast.unparse(annotation)))

    for path in sorted(root.rglob("*.py")):
        if any(part.startswith("_") for part in path.relative_to(root).parts[:-1]):
            continue
        if path.name.startswith("_") and path.name != "__init__.py":
            continue
        visit(ast.parse(path.read_text(encoding="utf-8")).body, path, "")
    return found


def test_public_signatures_use_precise_types_not_bare_any():
    annotations = public_annotations()
    bare = [place for place, source in annotations if source == "Any"]
    assert len(annotations) > 1000  # the walk found the package's signatures
    # The protocols (Sampler, Scorer, Policy, Task, Source), gymnasium's Env and precise types
    # say what goes in; a bare Any is kept only where any value is what is meant.
    assert len(bare) / len(annotations) <= 0.05, "\n".join(bare)


def test_no_module_imports_itself_back_through_others():
    """No cycle among llm_gym's modules (a package's ``__init__`` re-exports are left out):
    typing-only imports count too, since they say which module knows which."""
    import ast
    from pathlib import Path

    root = Path(llm_gym.__file__).parent
    modules = {
        ".".join(("llm_gym", *path.relative_to(root).with_suffix("").parts)): path
        for path in root.rglob("*.py")
        if path.name != "__init__.py"
    }
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t != name}
    cycles, state = [], {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_the_architecture_page_names_every_module():
    # docs/architecture.md's table: each top-level module by its file name, each package's
    # modules in its package's row (``tools/``: ``interpreter.py``, ``vector/kl.py`` ...).
    from pathlib import Path

    root = Path(llm_gym.__file__).parent
    text = (root.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = {}
    for line in text.splitlines():
        cells = line.split("|")
        if line.startswith("| ") and len(cells) > 3:
            rows[cells[2].strip().strip("`")] = line
    missing = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if len(parts) == 1:
            named = path.name in text
        else:
            named = path.name == "__init__.py" or "/".join(parts[1:]) in rows.get(
                f"{parts[0]}/", ""
            )
        if not named:
            missing.append("/".join(parts))
    assert missing == []
