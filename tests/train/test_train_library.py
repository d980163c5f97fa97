"""``GRPOTrainer`` as a library, as TRL's: a model object (transformers or peft) and its
tokenizer train in place; the env is an id, a Gymnasium vector env or a callable making one;
bad combinations get one line naming the argument."""

import gymnasium as gym
import pytest
import torch
from policy_fixture import scripted_policy

from llm_gym.lm.loading import tiny_model
from llm_gym.lm.lora import AdapterDisabled, is_lora, with_lora
from llm_gym.train import GRPOConfig, GRPOTrainer

ROWS = [{"question": "What is 2 + 3?", "answer": "#### 5"}]  # one question, in every group


def config(tmp_path, **changes):
    values = dict(
        out=str(tmp_path / "run"), env="LLMChat-GSM8K-v0", env_args={"dataset": ROWS},
        groups=2, group_size=2, max_new_tokens=8, eval_episodes=0, iterations=1,
        learning_rate=1e-2, progress=False,
    )  # fmt: skip
    return GRPOConfig(**{**values, **changes})


def right_and_wrong(trainer):
    # In each group one response is right (reward 1.0) and one wrong (0.1): advantages ±0.7.
    trainer.policy = scripted_policy(trainer.tokenizer, lambda i, _: f"It is {5 + i % 2}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_model_object_trains_in_place_on_its_device_and_dtype(smollm2_tokenizer, tmp_path, dtype):
    model = tiny_model(smollm2_tokenizer, seed=0).to(dtype)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = GRPOTrainer(config(tmp_path), model=model, tokenizer=smollm2_tokenizer)
    assert trainer.model is model and trainer.dtype == dtype and trainer.device.type == "cpu"
    right_and_wrong(trainer)
    row = trainer.iteration(0)
    assert row["success"] == 0.5 and row["grad_norm"] > 0
    moved = [k for k, v in model.state_dict().items() if not torch.equal(v, start[k])]
    assert moved and next(model.parameters()).dtype == dtype
    summary = trainer.write([row], None, 1.0)
    assert summary["model"] == "LlamaForCausalLM"  # the object's, not config.model's
    trainer.close()
    trainer.lock.release()


def test_the_callers_model_gets_back_what_the_run_switched(smollm2_tokenizer, tmp_path):
    model = tiny_model(smollm2_tokenizer, seed=0).eval()
    before = (model.is_gradient_checkpointing, model.config._attn_implementation)
    assert before == (False, "sdpa")
    trainer = GRPOTrainer(
        config(tmp_path, gradient_checkpointing=True), model=model, tokenizer=smollm2_tokenizer
    )
    # During the run: checkpointing on, attention switched to the packed kind.
    assert model.is_gradient_checkpointing
    assert model.config._attn_implementation == "llm_gym_packed_sdpa"
    right_and_wrong(trainer)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.train()
    after = (model.is_gradient_checkpointing, model.config._attn_implementation)
    assert after == before and not model.training  # switched back, eval mode as given
    assert any(not torch.equal(v, start[k]) for k, v in model.state_dict().items())  # trained


def test_a_peft_model_trains_its_adapters_and_is_its_own_reference(smollm2_tokenizer, tmp_path):
    model = with_lora(tiny_model(smollm2_tokenizer, seed=0), 4)
    base = {k: v.clone() for k, v in model.state_dict().items() if "lora_" not in k}
    lora = {k: v.clone() for k, v in model.state_dict().items() if "lora_B" in k}
    run = config(tmp_path, kl_loss_coef=0.5)
    trainer = GRPOTrainer(run, model=model, tokenizer=smollm2_tokenizer)
    assert is_lora(trainer.model) and isinstance(trainer.reference, AdapterDisabled)  # no copy
    right_and_wrong(trainer)
    row = trainer.iteration(0)
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in base.items())  # the base stays frozen
    assert any(not torch.equal(state[k], v) for k, v in lora.items())
    assert row["approx_kl"] == 0.0 and row["grad_norm"] > 0  # one epoch: ratio 1
    trainer.close()
    trainer.lock.release()
    with pytest.raises(ValueError, match="model is a peft model already, and lora_rank=4"):
        run = config(tmp_path, lora_rank=4, overwrite=True)
        GRPOTrainer(run, model=model, tokenizer=smollm2_tokenizer)


def test_lora_rank_wraps_a_plain_model_object(smollm2_tokenizer, tmp_path):
    model = tiny_model(smollm2_tokenizer, seed=0)
    trainer = GRPOTrainer(config(tmp_path, lora_rank=2), model=model, tokenizer=smollm2_tokenizer)
    assert is_lora(trainer.model) and trainer.model.get_base_model() is model
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    trainer.close()
    trainer.lock.release()


def native(tokenizer, num_envs=4, **changes):
    kwargs = dict(
        dataset=ROWS, tokenizer=tokenizer, input_mode="tokens", repeats=2, group_repeats=True,
        observation_keys=("tokens", "history", "policy_mask"), answer_format="last_number",
    )  # fmt: skip
    return gym.make_vec(
        "LLMChat-GSM8K-v0", num_envs=num_envs, vectorization_mode="vector_entry_point",
        **{**kwargs, **changes},
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["vector env", "callable"])
def test_an_env_object_or_a_callable_is_what_the_run_plays(smollm2_tokenizer, tmp_path, kind):
    envs = native(smollm2_tokenizer)
    env = envs if kind == "vector env" else (lambda: envs)
    model = tiny_model(smollm2_tokenizer, seed=0)
    trainer = GRPOTrainer(config(tmp_path), model=model, tokenizer=smollm2_tokenizer, env=env)
    assert trainer.envs is envs
    right_and_wrong(trainer)
    row = trainer.iteration(0)
    assert row["success"] == 0.5 and row["reward"] == pytest.approx((1.0 + 0.1) / 2)
    trainer.close()
    trainer.lock.release()


def test_an_env_id_replaces_the_configs(smollm2_tokenizer, tmp_path):
    run = config(tmp_path, env="LLMChat-ReasoningGym-v0", env_args={"task": "chain_sum"})
    model = tiny_model(smollm2_tokenizer, seed=0)
    trainer = GRPOTrainer(
        run, model=model, tokenizer=smollm2_tokenizer, env="LLMChat-ReasoningGym-v0"
    )
    assert trainer.config.env == "LLMChat-ReasoningGym-v0"
    row = trainer.iteration(0)
    assert row["response_tokens"] > 0 and "chain_sum" in trainer.task_names
    trainer.close()
    trainer.lock.release()


def test_a_group_of_a_given_env_must_play_one_item(smollm2_tokenizer, tmp_path):
    # Four sub-envs on a two-question stream without repeats: a group's two play two items.
    rows = [*ROWS, {"question": "What is 1 + 1?", "answer": "#### 2"}]
    envs = native(smollm2_tokenizer, repeats=1, group_repeats=False, dataset=rows, shuffle=False)
    model = tiny_model(smollm2_tokenizer, seed=0)
    trainer = GRPOTrainer(config(tmp_path), model=model, tokenizer=smollm2_tokenizer, env=envs)
    right_and_wrong(trainer)
    with pytest.raises(ValueError, match=r"sub-envs 0\.\.1 \(one group\) played 2 different"):
        trainer.iteration(0)
    trainer.close()
    trainer.lock.release()


def test_library_arguments_get_one_line_naming_them(smollm2_tokenizer, tmp_path):
    model = tiny_model(smollm2_tokenizer, seed=0)
    with pytest.raises(ValueError, match="model was given without its tokenizer"):
        GRPOTrainer(config(tmp_path), model=model)
    with pytest.raises(ValueError, match="tokenizer was given without its model"):
        GRPOTrainer(config(tmp_path), tokenizer=smollm2_tokenizer)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module .*, got Tokenizers"):
        GRPOTrainer(config(tmp_path), model=smollm2_tokenizer, tokenizer=model)  # swapped
    with pytest.raises(TypeError, match="tokenizer must be a transformers tokenizer, got str"):
        GRPOTrainer(config(tmp_path), model=model, tokenizer="gpt2")
    frozen = tiny_model(smollm2_tokenizer, seed=0).requires_grad_(False)
    with pytest.raises(ValueError, match="model has no parameter that requires grad"):
        GRPOTrainer(config(tmp_path), model=frozen, tokenizer=smollm2_tokenizer)
    half = tiny_model(smollm2_tokenizer, seed=0).to(torch.float16)
    with pytest.raises(ValueError, match="model holds float16 weights, which train only with"):
        GRPOTrainer(config(tmp_path), model=half, tokenizer=smollm2_tokenizer)
    bf16 = tiny_model(smollm2_tokenizer, seed=0).to(torch.bfloat16)
    with pytest.raises(ValueError, match="dtype='float32' asks another dtype than the model's"):
        GRPOTrainer(config(tmp_path, dtype="float32"), model=bf16, tokenizer=smollm2_tokenizer)
    with pytest.raises(TypeError, match="env must be an env id, a gymnasium VectorEnv .*, got int"):
        GRPOTrainer(config(tmp_path), model=model, tokenizer=smollm2_tokenizer, env=42)
    with pytest.raises(ValueError, match="a model or env object cannot be resumed into"):
        GRPOTrainer(config(tmp_path, resume=True), model=model, tokenizer=smollm2_tokenizer)
    envs = native(smollm2_tokenizer)
    with pytest.raises(ValueError, match="env as an object does not go with --eval-episodes"):
        GRPOTrainer(config(tmp_path, eval_episodes=4), env=envs)
    with pytest.raises(ValueError, match=r"env has 4 sub-envs; .* 3 × 2 = 6"):
        GRPOTrainer(config(tmp_path, groups=3), model=model, tokenizer=smollm2_tokenizer, env=envs)
    with pytest.raises(TypeError, match="env\\(\\) must make a gymnasium VectorEnv, got str"):
        GRPOTrainer(config(tmp_path), model=model, tokenizer=smollm2_tokenizer, env=lambda: "x")
    history = native(smollm2_tokenizer, observation_keys=("tokens", "history"))
    with pytest.raises(ValueError, match="env must observe 'tokens', 'history' and 'policy_m"):
        GRPOTrainer(config(tmp_path), model=model, tokenizer=smollm2_tokenizer, env=history)
    assert not (tmp_path / "run" / "run_config.json").exists()  # nothing written on an error


def test_train_runs_once_and_says_how_to_go_on(smollm2_tokenizer, tmp_path):
    model = tiny_model(smollm2_tokenizer, seed=0)
    trainer = GRPOTrainer(config(tmp_path), model=model, tokenizer=smollm2_tokenizer)
    right_and_wrong(trainer)
    assert trainer.train()["iterations"] == 1
    rows = (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(RuntimeError, match=r"train\(\) has run: .*resumed_config\("):
        trainer.train()
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == rows  # nothing run again


def test_an_attention_that_cannot_pack_runs_padded_and_says_so(smollm2_tokenizer, tmp_path, capsys):
    model = tiny_model(smollm2_tokenizer, seed=0)
    model.set_attn_implementation("eager")
    trainer = GRPOTrainer(config(tmp_path), model=model, tokenizer=smollm2_tokenizer)
    assert trainer.updater.packing is False and model.config._attn_implementation == "eager"
    err = capsys.readouterr().err
    assert "llm-gym: note: packing is off: the model's attention (eager) cannot keep" in err
    trainer.close()
    trainer.lock.release()
