"""Learning cards (issue 74): a recipe's curve over seeds, and ``llm-gym profile --compare
RUN_DIR`` holding a training run against its task's card; bad input one line each."""

import json
import math

import pytest

from llm_gym.cli import main
from llm_gym.run.learning import (
    LEARNING_CARDS,
    compare_run,
    find_learning_card,
    learning_card,
    load_learning_card,
)
from tests.train_fixture import keep_torch_threads, train_args  # noqa: F401

CONFIG = {"env": "LLMChat-ReasoningGym-v0", "env_args": {"task": "chain_sum"}, "iterations": 3}


def fake_run(folder, seed, curve, before=0.25, after=0.5, **config):
    # A training run's folder as `llm-gym train` leaves it, with the given curve.
    folder.mkdir(parents=True)
    (folder / "run_config.json").write_text(json.dumps({**CONFIG, "seed": seed, **config}))
    (folder / "metrics.jsonl").write_text(
        "".join(json.dumps({"iteration": i, "success": v}) + "\n" for i, v in enumerate(curve))
    )
    summary = {"dtype": "bfloat16", "before": {"success": before}, "after": {"success": after}}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_a_card_is_the_seeds_curves_mean_and_se(tmp_path):
    curves = [[0.0, 0.5, 1.0], [0.5, 0.5, 0.5], [0.25, 0.5, 0.75]]
    runs = [fake_run(tmp_path / f"s{s}", s, c, after=c[-1]) for s, c in enumerate(curves)]
    card = learning_card(runs, "llm-gym train --seed SEED")
    assert card["seeds"] == [0, 1, 2] and card["curves"] == curves
    assert card["mean"] == pytest.approx([0.25, 0.5, 0.75])
    assert card["se"] == pytest.approx([0.25 / math.sqrt(3), 0.0, 0.25 / math.sqrt(3)])
    assert card["greedy_after"] == [1.0, 0.5, 0.75] and card["dtype"] == "bfloat16"
    assert card["options"]["env_args"] == {"task": "chain_sum"}
    # A run within, one above, one below: each iteration placed against the band.
    run = fake_run(tmp_path / "mine", 9, [0.1, 0.9, -0.1])
    rows = compare_run(run, card)["rows"]
    assert [r["where"] for r in rows] == ["within", "above", "below"]
    assert rows[0]["low"] == 0.0 and rows[1]["high"] == 0.5  # a share's band: within [0, 1]
    assert rows[2]["low"] == pytest.approx(0.75 - 2 * 0.25 / math.sqrt(3))
    # Runs of different recipes make no card.
    other = fake_run(tmp_path / "lr", 5, [0, 0, 0], learning_rate=1.0)
    with pytest.raises(ValueError, match=r"differs in \['learning_rate'\]"):
        learning_card([runs[0], other], "x")


def test_the_shipped_cards_are_four_seeds_of_their_recipe():
    for name in LEARNING_CARDS:
        card = load_learning_card(name)
        assert len(card["seeds"]) == 4 == len(card["curves"]) == len(card["greedy_after"])
        iterations = card["options"]["iterations"]
        assert all(len(curve) == iterations for curve in card["curves"])
        assert len(card["mean"]) == len(card["se"]) == iterations
        assert find_learning_card(card["options"])[0] == name


def test_profile_compare_holds_a_real_run_against_its_card(tiny_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(train_args(tiny_dir, run)) == 0
    capsys.readouterr()
    out = tmp_path / "compared"
    assert main(["profile", "--compare", str(run), "--out", str(out)]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[0].startswith("against learning card 'chain_sum': llm-gym train")
    assert said[1] == "| iteration | run's success | card's mean | card's band | where |"
    assert [line.split(" | ")[0] for line in said[3:5]] == ["| 0", "| 1"]  # its 2 iterations
    assert any(line.startswith("the run's iterations is 2, the card's 20") for line in said)
    assert any(line.startswith("the run's model is ") for line in said)
    assert (out / "comparison.md").read_text().splitlines()[0] == said[0]
    assert (out / "comparison.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--levels", "0"], "--compare plays nothing, it reads the run's folder: drop --levels"),
        (["--samples", "2", "--model", "x"], "drop --model, --samples"),
    ],
)  # fmt: skip
def test_compare_refuses_flags_it_would_ignore(tmp_path, capsys, args, message):
    run = fake_run(tmp_path / "r", 0, [0.5])
    assert main(["profile", "--compare", str(run), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_run_without_a_card_or_a_folder_is_one_line(tmp_path, capsys):
    gsm8k = fake_run(tmp_path / "g", 0, [0.5], env="LLMChat-GSM8K-v0", env_args={})
    broken = fake_run(tmp_path / "b", 0, [0.5])
    (broken / "metrics.jsonl").write_text('{"success": "high"}\n')
    for run, message in ((gsm8k, "no learning card for LLMChat-GSM8K-v0"),
                         (tmp_path / "none", "holds no run_config.json"),
                         (broken, "metrics.jsonl: line 1 has no number 'success'")):  # fmt: skip
        assert main(["profile", "--compare", str(run), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
