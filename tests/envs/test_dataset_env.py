"""DatasetChatEnv: data sources, seeded epochs, repeats, dataloaders and errors."""

import json
import subprocess
import sys
from collections import Counter

import datasets
import numpy as np
import pytest
import torch
from gsm8k_fixture import FIXTURE  # made-up problems, written to a temp folder
from gymnasium.utils.env_checker import check_env

from llm_gym.envs import DatasetChatEnv
from llm_gym.sources import datasets as data_sources

ROWS = [{"query": f"q{i}", "id": i} for i in range(10)]


def queries(env, n):
    return [env.reset()[0]["history"][-1]["content"] for _ in range(n)]


def ids(env, n):
    return [env.reset()[1]["id"] for _ in range(n)]


# -- data sources ---------------------------------------------------------------------


def test_list_of_dicts_with_field_map_and_info():
    rows = [{"question": "What is 1+1?", "answer": "#### 2", "level": 1}]
    env = DatasetChatEnv(rows, field_map={"question": "query"}, system_prompt="Be brief.")
    obs, info = env.reset(seed=0)
    assert obs["history"] == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 1+1?"},
    )
    assert info == {"answer": "#### 2", "level": 1}
    assert env.item == {"query": "What is 1+1?", "answer": "#### 2", "level": 1}


def test_field_map_as_function():
    env = DatasetChatEnv(ROWS, field_map=lambda r: {"query": r["query"].upper(), "n": r["id"]})
    obs, info = env.reset(seed=0)
    assert obs["history"][-1]["content"] == f"Q{info['n']}"


def test_datasets_dataset_and_datasetdict():
    ds = datasets.Dataset.from_list(ROWS)
    assert sorted(ids(DatasetChatEnv(ds, seed=1), 10)) == list(range(10))
    dd = datasets.DatasetDict({"train": ds, "test": ds.select([3])})
    assert ids(DatasetChatEnv(dd, split="test"), 2) == [3, 3]
    assert len(set(ids(DatasetChatEnv(dd), 10))) == 10  # no split: "train", as TorchRL


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_local_files(tmp_path, suffix):
    path = tmp_path / f"data{suffix}"
    if suffix == ".parquet":
        datasets.Dataset.from_list(ROWS).to_parquet(str(path))
    elif suffix == ".json":
        path.write_text(json.dumps(ROWS))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    env = DatasetChatEnv(str(path), shuffle=False)
    assert ids(env, 10) == list(range(10))


def test_local_folder_split_by_file_name():
    env = DatasetChatEnv(FIXTURE, split="test", field_map={"question": "query"}, shuffle=False)
    obs, info = env.reset()
    assert obs["history"][-1]["content"].startswith("Janet’s hens")
    assert info["answer"].endswith("#### 18")
    train = DatasetChatEnv(str(FIXTURE), split="train", field_map={"question": "query"})
    assert len(train.source) == 10


def test_hub_name_goes_to_load_dataset(monkeypatch):
    calls = []

    def fake_load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        return datasets.Dataset.from_list(ROWS)

    monkeypatch.setattr(data_sources, "hub_unavailable_reason", lambda: None)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    env = DatasetChatEnv("someone/data", name="main", split="test")
    assert calls == [("someone/data", "main", "test")]
    assert len(set(ids(env, 10))) == 10


def test_hub_unreachable_fails_fast_with_advice(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: refused
    assert "127.0.0.1:9 is unreachable" in data_sources.hub_unavailable_reason()
    with pytest.raises(ConnectionError, match=r"'someone/data'.*HF_HUB_OFFLINE=1"):
        DatasetChatEnv("someone/data")


# -- order, epochs, repeats -----------------------------------------------------------


@pytest.mark.parametrize("repeats", [1, 3])
def test_each_epoch_serves_every_item_exactly_once(repeats):
    env = DatasetChatEnv(ROWS, seed=7, repeats=repeats)
    env.reset(seed=7)
    served = [env.item["id"]] + ids(env, 3 * 10 * repeats - 1)  # three epochs
    epochs = [served[i : i + 10 * repeats] for i in range(0, len(served), 10 * repeats)]
    for epoch in epochs:
        assert Counter(epoch) == {i: repeats for i in range(10)}
        # repeats in a row: a GRPO group is `repeats` consecutive episodes
        assert all(len(set(epoch[j : j + repeats])) == 1 for j in range(0, len(epoch), repeats))
    orders = [epoch[::repeats] for epoch in epochs]
    assert orders[0] != orders[1] != orders[2]  # each epoch reshuffles


def test_same_seed_same_order_and_reseed_on_reset():
    a, b = DatasetChatEnv(ROWS, seed=3), DatasetChatEnv(ROWS, seed=3)
    first = ids(a, 25)
    assert ids(b, 25) == first
    assert ids(DatasetChatEnv(ROWS, seed=4), 25) != first
    # reset(seed=...) restarts the order that seed defines, wherever the stream was
    assert [a.reset(seed=3)[1]["id"]] + ids(a, 24) == first
    c = DatasetChatEnv(ROWS)  # no seed: random until reset(seed=...)
    assert [c.reset(seed=3)[1]["id"]] + ids(c, 24) == first


def test_no_shuffle_keeps_dataset_order():
    assert ids(DatasetChatEnv(ROWS, shuffle=False), 12) == list(range(10)) + [0, 1]


def test_order_is_numpy_permutation_of_seed_and_epoch():
    # The documented contract, so other tools can reproduce the order.
    env = DatasetChatEnv(ROWS, seed=11)
    expected = np.concatenate([np.random.default_rng([11, e]).permutation(10) for e in (0, 1)])
    assert ids(env, 20) == expected.tolist()


def test_same_seed_same_order_in_another_process():
    script = (
        "from llm_gym.envs import DatasetChatEnv\n"
        f"env = DatasetChatEnv({ROWS!r}, seed=123, repeats=2)\n"
        "print([env.reset()[1]['id'] for _ in range(30)])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(ids(DatasetChatEnv(ROWS, seed=123, repeats=2), 30))


def test_reset_dataloader_rewinds_to_the_start():
    env = DatasetChatEnv(ROWS, seed=5, repeats=2)
    first = ids(env, 7)
    assert env.reset_dataloader() is env
    assert ids(env, 7) == first


def test_options_item_serves_a_given_item_without_advancing():
    env = DatasetChatEnv(ROWS, seed=0)
    expected = ids(DatasetChatEnv(ROWS, seed=0), 2)
    assert env.reset(options={"item": {"query": "mine", "id": -1}})[1] == {"id": -1}
    assert ids(env, 2) == expected


def test_episode_is_single_turn_by_default_and_check_env_passes():
    env = DatasetChatEnv(ROWS)
    check_env(env, skip_render_check=True)
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step("answer")
    # The ended step names its item; no reward version (the env's reward is unversioned).
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info == {"item": env.unwrapped.item} and info["item"]["query"].startswith("q")
    multi = DatasetChatEnv(ROWS, max_turns=2)
    multi.reset(seed=0)
    assert multi.step("a")[2:4] == (False, False)
    assert multi.step("b")[2:4] == (False, True)


def test_text_and_tokens_modes(gpt2_tokenizer):
    env = DatasetChatEnv(
        ROWS,
        input_mode="tokens",
        tokenizer=gpt2_tokenizer,
        observation_keys=("text", "tokens"),
        system_prompt="S",
    )
    obs, _ = env.reset(seed=0)
    assert obs["text"].startswith("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq")
    assert gpt2_tokenizer.decode(obs["tokens"].tolist()) == obs["text"]
    assert env.observation_space.contains(obs)


# -- dataloaders ----------------------------------------------------------------------


def test_from_dataloader_torch_dataloader_batches():
    loader = torch.utils.data.DataLoader(ROWS, batch_size=4, shuffle=False)  # dicts of lists
    env = DatasetChatEnv.from_dataloader(loader, repeats=2)
    assert ids(env, 24) == [i for i in list(range(10)) + [0] for _ in range(2)] + [1, 1]
    assert isinstance(env.item["id"], int)  # tensors are unbatched into Python values
    env.reset_dataloader()
    assert ids(env, 3) == [0, 0, 1]


def test_from_dataloader_single_items_and_lists():
    env = DatasetChatEnv.from_dataloader([ROWS[:2], ROWS[5]])
    assert ids(env, 4) == [0, 1, 5, 0]


def test_from_dataloader_one_shot_iterator_is_an_error():
    env = DatasetChatEnv.from_dataloader(iter(ROWS[:2]))
    assert ids(env, 2) == [0, 1]
    with pytest.raises(ValueError, match="one-shot iterator"):
        env.reset()


def test_from_dataloader_rejects_order_arguments_and_non_iterables():
    with pytest.raises(TypeError, match="takes no seed="):
        DatasetChatEnv.from_dataloader(ROWS, seed=0)
    with pytest.raises(TypeError, match="dataloader must be an iterable.*got int"):
        DatasetChatEnv.from_dataloader(3)


def test_iterable_dataset_is_served_as_a_stream():
    stream = datasets.Dataset.from_list(ROWS).to_iterable_dataset()
    assert ids(DatasetChatEnv(stream), 11) == list(range(10)) + [0]


# -- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize("repeats", [0, -2, 1.5, True, "3"])
def test_bad_repeats(repeats):
    with pytest.raises(ValueError, match=rf"repeats must be an int >= 1.*got {repeats!r}"):
        DatasetChatEnv(ROWS, repeats=repeats)


def test_field_map_naming_a_missing_column():
    with pytest.raises(
        ValueError, match=r"field_map names columns \['questio'\].*\['query', 'id'\]"
    ):
        DatasetChatEnv(ROWS, field_map={"questio": "query"})
    ds = datasets.Dataset.from_list([{"question": "x"}])
    with pytest.raises(ValueError, match=r"\['questio'\].*\['question'\]"):
        DatasetChatEnv(ds, field_map={"questio": "query"})


def test_dataset_without_query_field():
    with pytest.raises(ValueError, match=r"str 'query' field.*field_map.*\['answer', 'question'\]"):
        DatasetChatEnv([{"question": "x", "answer": "y"}])


def test_bad_field_map_type():
    with pytest.raises(TypeError, match="field_map must be a dict.*got list"):
        DatasetChatEnv(ROWS, field_map=["query"])


@pytest.mark.parametrize(
    "dataset, error, match",
    [
        ([], ValueError, "at least one item"),
        ([{"query": "a"}, "b"], TypeError, "must hold dicts, got str at index 1"),
        (42, TypeError, "dataset must be a Hub dataset name.*got int"),
        ("./no/such/file.jsonl", FileNotFoundError, "does not exist"),
        ("no_such_file.parquet", FileNotFoundError, "'no_such_file.parquet' does not exist"),
    ],
)
def test_bad_dataset(dataset, error, match):
    with pytest.raises(error, match=match):
        DatasetChatEnv(dataset)


def test_bad_file_type_and_split(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("query\na\n")
    with pytest.raises(ValueError, match=r"must end in .jsonl, .json, .parquet, got 'data.csv'"):
        DatasetChatEnv(path)
    with pytest.raises(ValueError, match=r"split='validation'"):
        DatasetChatEnv(FIXTURE, split="validation", field_map={"question": "query"})
    dd = datasets.DatasetDict({"a": datasets.Dataset.from_list(ROWS)})
    with pytest.raises(ValueError, match=r"split must be one of \['a'\].*got 'b'"):
        DatasetChatEnv(dd, split="b")


def test_bad_seed():
    with pytest.raises(ValueError, match="seed must be None or an int >= 0, got -1"):
        DatasetChatEnv(ROWS, seed=-1)


def test_bad_reset_options_change_nothing():
    env = DatasetChatEnv(ROWS, seed=0, repeats=2)
    obs, _ = env.reset()
    expected = ids(DatasetChatEnv(ROWS, seed=0, repeats=2), 3)[1:]
    with pytest.raises(ValueError, match=r"unknown keys \['query'\]"):
        env.reset(options={"query": "x"})
    with pytest.raises(KeyError, match="str 'query' field"):
        env.reset(seed=99, options={"item": {"question": "x"}})
    with pytest.raises(TypeError, match="an item must be a dict"):
        env.reset(options={"item": "x"})
    assert env.history.to_chats() == obs["history"]
    assert ids(env, 2) == expected


# -- token prompts --------------------------------------------------------------------


@pytest.mark.parametrize("tokenizer_name", ["gpt2_tokenizer", "smollm2_tokenizer"])
def test_token_prompts_equal_encoding_the_whole_text(tokenizer_name, request):
    tokenizer = request.getfixturevalue(tokenizer_name)
    env = DatasetChatEnv(
        FIXTURE,
        split="train",
        field_map={"question": "query"},
        system_prompt="Think, then answer.",
        input_mode="tokens",
        tokenizer=tokenizer,
        observation_keys=("text", "tokens"),
    )
    from types import SimpleNamespace

    backend, sent = env.codec.backend, []  # what reaches the Rust tokenizer
    env.codec.backend = SimpleNamespace(
        encode=lambda text, **kw: sent.append(text) or backend.encode(text, **kw),
        encode_batch=lambda texts, **kw: sent.extend(texts) or backend.encode_batch(texts, **kw),
    )
    texts = []
    for _ in range(12):
        obs, _ = env.reset()
        whole = tokenizer(obs["text"], add_special_tokens=False)["input_ids"]
        assert obs["tokens"].tolist() == whole
        texts.append(obs["text"])
    # SmolLM2's ChatML turns start with a special token, so the system prompt's tokens are
    # reused (only the rest of each prompt is encoded); GPT-2 has no such token in its
    # template and encodes whole prompts.
    sent_whole = sum(text in sent for text in texts)
    assert sent_whole == (0 if tokenizer_name == "smollm2_tokenizer" else 12)


def test_system_prompt_tokens_are_not_reused_when_inexact(smollm2_tokenizer):
    tok, keys = smollm2_tokenizer, ("tokens", "text")
    env = DatasetChatEnv(ROWS, system_prompt="S", tokenizer=tok, observation_keys=keys)
    from types import SimpleNamespace

    backend = env.codec.backend

    def encode(text, **kwargs):  # ids that depend on the whole text: no prefix is reusable
        return SimpleNamespace(ids=backend.encode(text, **kwargs).ids + [len(text) % 5])

    env.codec.backend = SimpleNamespace(
        encode=encode, encode_batch=lambda texts, **kw: [encode(t, **kw) for t in texts]
    )
    for _ in range(3):
        obs, _ = env.reset()
        text = obs["text"]
        expected = backend.encode(text, add_special_tokens=False).ids + [len(text) % 5]
        assert obs["tokens"].tolist() == expected
    assert env.codec.shared_prefix is None
