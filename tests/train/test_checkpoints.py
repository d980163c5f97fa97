"""Runs that resume exactly: checkpoints written atomically and rotated, a resumed run equal to
an uninterrupted one, Ctrl-C at any moment of a save, one-line errors on broken files."""

import json
import os
import shutil
import warnings

import pytest
import torch

from llm_gym.lm.loading import load_model, tiny_model
from llm_gym.sources import ProceduralSource
from llm_gym.train import GRPOConfig, GRPOTrainer, resumed_config
from llm_gym.train.checkpoints import checkpoint_folders, latest_checkpoint, load_checkpoint
from llm_gym.train.optim import MasterAdamW
from llm_gym.train.sharding import load_optimizer, save_optimizer

TIMING = ("seconds", "tokens_per_second")  # the only metrics allowed to differ


# One thread: reductions in one order, so that runs compare bit for bit.
pytestmark = pytest.mark.usefixtures("one_thread")


def config(model, out, **changes):
    # The KL penalty with an adaptive coefficient makes rewards differ by question and
    # response, so the updates and the curves depend on every piece of state a resume
    # restores: weights, optimizer, RNG, question stream, curriculum, KL coefficient. float32
    # pinned: in bfloat16 (--dtype auto on a CPU with bf16) these tiny updates round away.
    values = dict(
        model=model, out=str(out), env_args={"task": "chain_sum", "level": 2},
        curriculum=4, kl_coef=0.5, kl_target=0.01, learning_rate=1e-2,
        groups=2, group_size=2, max_new_tokens=4, eval_episodes=0,
        iterations=4, save_every=2, progress=False, dtype="float32",
    )  # fmt: skip
    return GRPOConfig(**{**values, **changes})


def metrics(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


# TRL's loss variants, the k3 KL term, batch-scaled advantages, truncated IS weights and two
# epochs (so that ratios move and clip): all kept by the run's config and resumed alike.
# The interrupted run is emulated by a shorter one, resumed with more iterations: a rate that
# decays over the run's steps would differ, so these hold it (SCHEDULE decays it over the
# resumed run's steps, its warm-up the same either way).
CONSTANT = dict(lr_schedule="constant", warmup_steps=0)
# The adaptive entropy bonus's target is above the tiny model's entropy: its coefficient
# rises every step, so a resume that lost it would differ.
VARIANTS = dict(
    loss_type="dapo", clip_coef_high=0.28, delta=1.5, kl_loss_coef=0.04, scale_rewards="batch",
    tis_cap=2.0, update_epochs=2, entropy_coef=0.01, entropy_target=100.0,
    entropy_coef_delta=0.01, **CONSTANT,
)  # fmt: skip


# A learning rate that warms up and decays: its position is the optimizer's step count.
SCHEDULE = dict(lr_schedule="cosine", warmup_steps=2)


@pytest.mark.parametrize(
    "variant",
    [
        dict(loss_type="grpo", **CONSTANT),
        # The others, a run and its resumption each (about 9 s), in the slow mark.
        pytest.param(VARIANTS, marks=pytest.mark.slow),
        pytest.param(SCHEDULE, marks=pytest.mark.slow),
    ],
    ids=["grpo", "dapo+k3+tis", "cosine+warmup"],
)
def test_a_resumed_run_equals_an_uninterrupted_one(tiny_dir, tmp_path, variant):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    GRPOTrainer(config(tiny_dir, whole, **variant)).train()
    # A run's last checkpoint keeps the optimizer's state only when asked: this one goes on.
    GRPOTrainer(config(tiny_dir, parts, iterations=2, save_optimizer=True, **variant)).train()
    resumed = GRPOTrainer(resumed_config(parts, iterations=4))
    assert (
        resumed.first_iteration == 2 and resumed.config.kl_target == 0.01
    )  # the saved run's config
    for key, value in variant.items():
        assert getattr(resumed.config, key) == value
    resumed.train()
    expected = metrics(whole)
    assert [row["iteration"] for row in expected] == [0, 1, 2, 3]
    assert len({row["kl"] for row in expected}) == 4  # the curves carry information
    # The level falls at each iteration's end (4 failures a window): a resume at 2 restores
    # both the level the current questions were drawn at and the one to draw the next at.
    assert [row["level"] for row in expected] == [1, 0, 0, 0]
    if variant is SCHEDULE:  # from 0 over 2 steps, then half a cosine to 0 at step 4
        rates = [row["learning_rate"] for row in expected]
        assert rates == pytest.approx([0.0, 0.5e-2, 1e-2, 0.5e-2])
    elif variant is VARIANTS:  # the update's diagnostics, the second epoch's: ratios moved
        # Two steps an iteration, each 0.01 up: where the next step starts.
        coefs = [row["entropy_coef"] for row in expected]
        assert coefs == pytest.approx([0.03, 0.05, 0.07, 0.09])
        assert all(row["approx_kl"] > 0 and row["entropy"] > 0 for row in expected)
        assert any(row["clip_fraction"] > 0 for row in expected)
        assert all(0 <= row["tis_truncated"] <= 1 for row in expected)
    got = metrics(parts)
    for a, b in zip(got, expected, strict=True):
        assert a.keys() == b.keys()
        for key, value in b.items():
            assert a[key] == pytest.approx(value, abs=1e-6), (b["iteration"], key)
    weights = [load_model(latest_checkpoint(out))[0].state_dict() for out in (whole, parts)]
    for name, value in weights[0].items():
        torch.testing.assert_close(weights[1][name], value, atol=1e-6, rtol=0)


def test_bfloat16_masters_go_through_the_checkpoints_optimizer_folder(smollm2_tokenizer, tmp_path):
    # --precision bf16: the weights in bfloat16, AdamW's over float32 masters. Its state goes
    # through torch.distributed.checkpoint as a plain AdamW's does (it failed there with
    # KeyError 'state'), masters included, and the resumed optimizer steps on exactly.
    def model():
        return tiny_model(smollm2_tokenizer, seed=0).to(torch.bfloat16)

    whole, resumed = model(), model()
    optimizers = [MasterAdamW(list(m.parameters()), lr=1e-3) for m in (whole, resumed)]
    g = torch.Generator().manual_seed(0)
    grads = [[torch.randn(p.shape, generator=g).to(p.dtype) for p in whole.parameters()]
             for _ in range(4)]  # fmt: skip

    def step(m, optimizer, grad):
        for p, value in zip(m.parameters(), grad, strict=True):
            p.grad = value.clone()
        optimizer.step()

    for grad in grads[:2]:
        step(whole, optimizers[0], grad)
    save_optimizer(whole, optimizers[0], tmp_path / "optimizer")
    resumed.load_state_dict(whole.state_dict())
    load_optimizer(resumed, optimizers[1], tmp_path / "optimizer")
    masters = [optimizer.masters for optimizer in optimizers]
    assert all(torch.equal(a, b) for a, b in zip(*masters, strict=True))
    weights = list(whole.parameters())  # the masters are finer than the weights they round to
    assert any(not torch.equal(m, w.float()) for m, w in zip(masters[0], weights, strict=True))
    for grad in grads[2:]:
        for m, optimizer in zip((whole, resumed), optimizers, strict=True):
            step(m, optimizer, grad)
    for a, b in zip(whole.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_bfloat16_run_saves_its_optimizer_and_resumes(tiny_dir, tmp_path):
    bf16 = dict(precision="bf16", dtype="bfloat16", iterations=2, save_every=1)
    GRPOTrainer(config(tiny_dir, tmp_path, save_optimizer=True, **bf16)).train()
    assert [c.name for c in checkpoint_folders(tmp_path)] == ["checkpoint-1", "checkpoint-2"]
    assert all((c / "optimizer").is_dir() for c in checkpoint_folders(tmp_path))
    resumed = GRPOTrainer(resumed_config(tmp_path, iterations=3))
    assert resumed.first_iteration == 2 and isinstance(resumed.optimizer, MasterAdamW)
    assert resumed.train()["iterations"] == 3


def test_resume_without_flags_keeps_the_saved_config_and_refuses_other_changes(tiny_dir, tmp_path):
    GRPOTrainer(config(tiny_dir, tmp_path, iterations=1, save_every=1)).train()
    restored = resumed_config(tmp_path, iterations=2, eval_episodes=4)
    assert restored.env_args == {"task": "chain_sum", "level": 2} and restored.kl_coef == 0.5
    assert restored.curriculum == 4 and restored.iterations == 2 and restored.resume
    with pytest.raises(ValueError, match=r"kl_coef=0\.1 differs from the resumed run's kl_coef"):
        resumed_config(tmp_path, kl_coef=0.1)
    with pytest.raises(ValueError, match=r"env_args=\{'task': 'leg_counting'\} differs"):
        GRPOTrainer(config(tiny_dir, tmp_path, env_args={"task": "leg_counting"}, resume=True))
    saved = json.loads((tmp_path / "run_config.json").read_text())
    assert saved["env_args"] == {"task": "chain_sum", "level": 2}  # not overwritten


def test_checkpoints_rotate_and_load_as_models(tiny_dir, tmp_path, smollm2_tokenizer):
    GRPOTrainer(config(tiny_dir, tmp_path, iterations=3, save_every=1, keep_checkpoints=2)).train()
    assert [path.name for path in checkpoint_folders(tmp_path)] == ["checkpoint-2", "checkpoint-3"]
    folder = latest_checkpoint(tmp_path)
    files = sorted(path.name for path in folder.iterdir())
    assert "model.safetensors" in files and "config.json" in files and "rng_state.pt" in files
    assert not any(name.endswith((".bin", ".partial")) for name in files)
    model, tokenizer = load_model(folder)  # what --model PATH does
    assert tokenizer.get_vocab() == smollm2_tokenizer.get_vocab()
    assert model.num_parameters() == tiny_model(smollm2_tokenizer, seed=0).num_parameters()
    state, tensors = load_checkpoint(folder)
    assert state["iteration"] == 3 and len(state["positions"]) == 4
    # The run's last checkpoint holds the weights alone; the one before, what a resume needs.
    assert set(tensors) == {"torch_rng", "cuda_rng"} and not (folder / "optimizer").exists()
    before = checkpoint_folders(tmp_path)[0]
    assert set(load_checkpoint(before)[1]) == {"torch_rng", "cuda_rng"}
    assert (before / "optimizer" / ".metadata").is_file()  # AdamW's, by DCP


def test_lean_checkpoints_save_the_last_weights_in_the_save_dtype(
    tiny_dir, tmp_path, capsys, monkeypatch
):
    from llm_gym.run import setup

    monkeypatch.setattr(setup, "_WARNED", set())  # a slow dtype would warn here, whatever ran
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        GRPOTrainer(
            config(tiny_dir, tmp_path, iterations=2, save_every=1, save_dtype="bfloat16")
        ).train()
    # A dtype to store in, not to compute in: no word about the CPU's bfloat16 speed.
    assert not [w for w in caught if "runs slowly" in str(w.message)]
    first, last = checkpoint_folders(tmp_path)
    sizes = [(path / "model.safetensors").stat().st_size for path in (first, last)]
    assert sizes[1] < 0.51 * sizes[0]  # bfloat16 weights beside float32's
    assert (first / "optimizer").is_dir() and not (last / "optimizer").exists()
    model = load_model(last)[0]  # loads in float32, as --model does
    trained = load_model(tiny_dir)[0]
    assert model.dtype == torch.float32
    for name, value in model.state_dict().items():  # bfloat16-rounded, exactly
        assert torch.equal(value, value.to(torch.bfloat16).float()), name
    assert any(
        not torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), trained.state_dict().values(), strict=True)
    )
    # Training on from it: AdamW starts afresh, and the run says so.
    GRPOTrainer(resumed_config(tmp_path, iterations=3)).train()
    assert "holds no optimizer state" in capsys.readouterr().err
    assert [path.name for path in checkpoint_folders(tmp_path)] == ["checkpoint-2", "checkpoint-3"]


def test_no_save_optimizer_leaves_it_out_of_every_checkpoint(tiny_dir, tmp_path):
    GRPOTrainer(
        config(tiny_dir, tmp_path, iterations=2, save_every=1, save_optimizer=False)
    ).train()
    assert all(
        set(load_checkpoint(p)[1]) == {"torch_rng", "cuda_rng"} and not (p / "optimizer").exists()
        for p in checkpoint_folders(tmp_path)
    )
    with pytest.raises(ValueError, match="save_dtype must be one of"):
        config(tiny_dir, tmp_path, save_dtype="int8")


@pytest.mark.parametrize(
    ("damage", "file"),
    [
        ("truncate", "model.safetensors"),
        ("truncate", "rng_state.pt"),
        ("truncate", "trainer_state.json"),
        ("delete", "model.safetensors"),
        ("delete", "config.json"),
        ("delete", "optimizer/.metadata"),  # DCP writes it last: a save cut short lacks it
    ],
)
def test_a_broken_checkpoint_file_is_named_in_one_line(tiny_dir, tmp_path, damage, file):
    run = config(tiny_dir, tmp_path, iterations=1, save_every=1, save_optimizer=True)
    GRPOTrainer(run).train()
    path = tmp_path / "checkpoint-1" / file
    if damage == "delete":
        path.unlink()
    else:
        os.truncate(path, path.stat().st_size // 2)
    with pytest.raises((ValueError, FileNotFoundError)) as caught:
        GRPOTrainer(resumed_config(tmp_path, iterations=2))
    message = str(caught.value)
    assert str(path) in message and "\n" not in message
    assert "missing" in message if damage == "delete" else "truncated or corrupt" in message


class Interrupt:
    """Patches the file operations a save makes so that the ``at``-th one raises Ctrl-C."""

    NAMES = (
        (os, "fsync"), (os, "replace"), (shutil, "rmtree"), (torch, "save"),
    )  # fmt: skip

    def __init__(self, monkeypatch, at):
        self.calls, self.at = 0, at
        for module, name in self.NAMES:
            monkeypatch.setattr(module, name, self.wrap(getattr(module, name)))

    def wrap(self, function):
        def interrupted(*args, **kwargs):
            self.calls += 1
            if self.calls == self.at:
                raise KeyboardInterrupt
            return function(*args, **kwargs)

        return interrupted


@pytest.mark.slow
def test_ctrl_c_at_any_moment_of_a_save_leaves_a_checkpoint_that_resumes(tiny_dir, tmp_path):
    # keep_checkpoints=1: the save also deletes the previous checkpoint, the riskiest moment.
    once = config(tiny_dir, tmp_path, iterations=1, save_every=1, keep_checkpoints=1)
    trainer = GRPOTrainer(once)
    trainer.train()
    at, finished = 0, False
    while not finished:
        at += 1
        with pytest.MonkeyPatch.context() as monkeypatch:
            interrupt = Interrupt(monkeypatch, at)
            try:
                trainer.save(2)
                finished = True
            except KeyboardInterrupt:
                pass
        assert interrupt.calls >= at or finished
        latest = latest_checkpoint(tmp_path)
        assert latest is not None, at
        state, _ = load_checkpoint(latest)  # whole: every file there and complete
        assert state["iteration"] == (2 if latest.name == "checkpoint-2" else 1)
        load_model(latest)
    assert at > 10  # every file written, flushed, renamed and deleted was a moment tried
    assert [path.name for path in tmp_path.iterdir() if "checkpoint" in path.name] == [
        "checkpoint-2"
    ]
    resumed = GRPOTrainer(resumed_config(tmp_path, iterations=3))
    assert resumed.first_iteration == 2
    resumed.train()
    assert [row["iteration"] for row in metrics(tmp_path)] == [0, 2]  # 1 was never finished


def test_seek_puts_a_source_at_a_stream_position():
    source = ProceduralSource(lambda seed, i, level: {"query": f"{seed}:{i}"}, num_levels=1,
                              level=0, seed=3)  # fmt: skip
    first = [source.next_item()["query"] for _ in range(5)]
    source.seek(2)
    assert [source.next_item()["query"] for _ in range(3)] == first[2:]
    with pytest.raises(ValueError, match="position must be an int >= 0, got -1"):
        source.seek(-1)
    assert source.position == 5  # the refused seek changed nothing


def test_overwrite_keeps_the_earlier_run_until_the_new_one_is_set_up(tiny_dir, tmp_path):
    GRPOTrainer(config(tiny_dir, tmp_path, iterations=1, save_every=1)).train()
    with pytest.raises(FileNotFoundError, match="is not a readable folder"):
        GRPOTrainer(config(str(tmp_path / "no-model"), tmp_path, overwrite=True))
    assert latest_checkpoint(tmp_path).name == "checkpoint-1"
    assert [row["iteration"] for row in metrics(tmp_path)] == [0]
    GRPOTrainer(config(tiny_dir, tmp_path, overwrite=True, eval_episodes=0))
    assert checkpoint_folders(tmp_path) == [] and not (tmp_path / "metrics.jsonl").exists()


def test_ctrl_c_during_training_writes_the_summary_and_resumes(tiny_dir, tmp_path):
    trainer = GRPOTrainer(config(tiny_dir, tmp_path, iterations=3, save_every=1))
    sample, calls = trainer.policy, []

    def interrupted_on_the_second_iteration(batch):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return sample(batch)

    trainer.policy = interrupted_on_the_second_iteration
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["iterations"] == 1
    assert summary["task"]["name"] == "chain_sum" and summary["after"] is None
    assert (tmp_path / "training.png").is_file() and (tmp_path / "report.md").is_file()
    assert GRPOTrainer(resumed_config(tmp_path)).first_iteration == 1


def test_cli_resume_restores_the_saved_run_and_names_a_conflicting_flag(tiny_dir, tmp_path, capsys):
    from llm_gym.cli import main

    out = str(tmp_path)
    first = ["train", "--model", tiny_dir, "--out", out, "--env-arg", "task=chain_sum",
             "--kl-coef", "0.05", "--curriculum", "2", "--iterations", "1", "--groups", "1",
             "--group-size", "2", "--max-new-tokens", "4", "--eval-episodes", "2",
             "--threads", "1", "--no-progress"]  # fmt: skip
    assert main(first) == 0
    saved = (tmp_path / "run_config.json").read_text()
    capsys.readouterr()
    # No flags but --resume: the saved task, KL and curriculum, not the defaults.
    assert main(["train", "--out", out, "--resume", "--iterations", "2", "--no-progress"]) == 0
    assert "greedy success on held-out questions" in capsys.readouterr().out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["task"]["name"] == "chain_sum" and summary["config"]["kl_coef"] == 0.05
    assert summary["config"]["curriculum"] == 2 and summary["config"]["iterations"] == 2
    assert (tmp_path / "run_config.json").read_text() == saved  # not overwritten
    # A flag that would make it another run: one line naming it; nothing changes.
    assert main(["train", "--out", out, "--resume", "--iterations", "3", "--kl-coef", "0.1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llm-gym: error: --kl-coef 0.1 differs from the resumed run's 0.05")
    assert err.count("\n") == 1 and latest_checkpoint(tmp_path).name == "checkpoint-2"
    # Finding 2: no evaluation on the resumed run is no TypeError.
    args = ["train", "--out", out, "--resume", "--iterations", "3", "--eval-episodes", "0"]
    assert main([*args, "--no-progress"]) == 0
    assert "greedy success" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("iteration", "abc", "an int >= 0"),
        ("positions", 5, "a list of ints or nulls"),
        ("level", 1.5, "an int or null"),
    ],
)
def test_a_wrong_field_in_trainer_state_is_named_with_its_file(
    tiny_dir, tmp_path, field, value, expected
):
    GRPOTrainer(config(tiny_dir, tmp_path, iterations=1, save_every=1)).train()
    path = tmp_path / "checkpoint-1" / "trainer_state.json"
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, field: value}))
    with pytest.raises(ValueError) as caught:
        GRPOTrainer(resumed_config(tmp_path, iterations=2))
    message = str(caught.value)
    assert message.startswith(
        f"checkpoint file {path}: field {field!r} must be {expected}, got {value!r}; delete"
    )
    assert "\n" not in message


def test_resume_refuses_when_the_metrics_file_is_gone(tiny_dir, tmp_path):
    GRPOTrainer(config(tiny_dir, tmp_path, iterations=1, save_every=1)).train()
    (tmp_path / "metrics.jsonl").unlink()
    with pytest.raises(FileNotFoundError) as caught:
        GRPOTrainer(resumed_config(tmp_path, iterations=2))
    message = str(caught.value)
    assert message.startswith(f"--resume: {tmp_path / 'metrics.jsonl'} is missing")
    assert "the rows of the iterations before checkpoint-1 (0 to 0)" in message
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing changed: the user may restore it
    assert latest_checkpoint(tmp_path).name == "checkpoint-1"
