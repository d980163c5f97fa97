"""The update sharded with FSDP2 across processes (issue 52, item 2), on the CPU over gloo:
two processes, each with its half of the batch, end with the weights one process reaches on
the whole batch, whatever each one's number of micro-batches."""

import json
import socket

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from llm_gym.lm.lora import with_lora
from llm_gym.train import GRPOConfig, per_token_advantages
from llm_gym.train.optim import adamw
from llm_gym.train.update import GRPOUpdate

LENGTHS = [30, 25, 21, 9, 12, 7]  # the first half: three micro-batches of 40; the second: one
ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 2.0, -2.0]


def batch(lengths):
    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, 256, size=n) for n in lengths]
    return tokens, [np.arange(n) >= 4 for n in lengths]


def config(folder, **options):
    return GRPOConfig(
        model=folder, max_tokens_per_microbatch=40, learning_rate=1e-3,
        gradient_checkpointing=False, lr_schedule="constant", **options,
    )  # fmt: skip


def prepared(model, lora):
    if lora:  # the same adapters everywhere: LoRA's A from the same seed (B starts at 0)
        torch.manual_seed(0)
        model = with_lora(model, 4)
    return model


def update(model, options, rows):
    tokens, masks = batch(LENGTHS)
    trained = [p for p in model.parameters() if p.requires_grad]
    updater = GRPOUpdate(model, adamw(trained, 1e-3), config("x", **options), 0)
    tokens, masks = [tokens[i] for i in rows], [masks[i] for i in rows]
    advantages = torch.tensor([ADVANTAGES[i] for i in rows])
    return updater(tokens, masks, per_token_advantages(advantages, [len(t) for t in tokens]))


# (LoRA, the update's options): every case runs in the same two processes (one start-up).
CASES = [
    (False, {}),
    (False, {"loss_type": "dapo", "update_epochs": 2, "clip_coef_high": 0.28}),
    (True, {"kl_loss_coef": 0.1}),  # the adapters sharded; the reference: adapters off
]


def sharded_process(rank, world, port, folder, out):
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from llm_gym.train.sharding import is_sharded, shard_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)  # fmt: skip
    try:
        for case, (lora, options) in enumerate(CASES):
            model = prepared(AutoModelForCausalLM.from_pretrained(folder), lora)
            shard_model(model)
            assert is_sharded(model)
            half = len(LENGTHS) // world
            row = update(model, options, list(range(rank * half, (rank + 1) * half)))
            weights = {k: v.full_tensor() for k, v in model.state_dict().items()}
            if rank == 0:
                torch.save(weights, f"{out}/weights-{case}.pt")
                with open(f"{out}/row-{case}.json", "w") as f:
                    json.dump(row, f)
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_sharded_update_as_one_does(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    mp.spawn(sharded_process, args=(2, free_port(), tiny_dir, str(tmp_path)), nprocs=2)
    for case, (lora, options) in enumerate(CASES):
        sharded = torch.load(tmp_path / f"weights-{case}.pt")
        sharded_row = json.loads((tmp_path / f"row-{case}.json").read_text())
        whole = prepared(AutoModelForCausalLM.from_pretrained(tiny_dir), lora)
        start = {k: v.clone() for k, v in whole.state_dict().items()}
        row = update(whole, options, list(range(len(LENGTHS))))
        for key in ("loss", "grad_norm", "approx_kl", "entropy", "clip_fraction"):
            # (after a first epoch's AdamW step, summation order's 1e-9 shows at 1e-5)
            assert sharded_row[key] == pytest.approx(row[key], abs=1e-6, rel=1e-4), (case, key)
        assert row["grad_norm"] > 0
        moved = [k for k, v in whole.state_dict().items() if not torch.equal(v, start[k])]
        assert moved  # the update did something to compare
        for key, value in whole.state_dict().items():
            message = f"case {case}: {key}"
            torch.testing.assert_close(sharded[key], value, atol=1e-5, rtol=0, msg=message)


def test_shard_model_without_a_process_group_says_how_to_run():
    from llm_gym.train.sharding import shard_model

    with pytest.raises(RuntimeError, match="needs torch.distributed's default process group"):
        shard_model(torch.nn.Linear(2, 2))


def checkpointed_process(rank, world, port, folder, out, resume):
    # resume=False: an update, the checkpoint (whole weights, sharded optimizer), a second
    # update; resume=True: from that checkpoint, the second update alone.
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from llm_gym.train.sharding import full_weights, load_optimizer, save_optimizer, shard_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)  # fmt: skip
    try:
        model = AutoModelForCausalLM.from_pretrained(f"{out}/saved" if resume else folder)
        shard_model(model)
        optimizer = adamw(list(model.parameters()), 1e-3)
        updater = GRPOUpdate(model, optimizer, config("x"), 0)
        half = len(LENGTHS) // world
        rows = list(range(rank * half, (rank + 1) * half))
        tokens, masks = batch(LENGTHS)

        def step():
            advantages = torch.tensor([ADVANTAGES[i] for i in rows])
            mine = [tokens[i] for i in rows]
            spread = per_token_advantages(advantages, [len(t) for t in mine])
            updater(mine, [masks[i] for i in rows], spread)

        if resume:
            load_optimizer(model, optimizer, f"{out}/optimizer")
        else:
            step()
            weights = full_weights(model)
            assert (weights is None) == (rank != 0)
            if rank == 0:
                model.save_pretrained(f"{out}/saved", state_dict=weights)
            save_optimizer(model, optimizer, f"{out}/optimizer")
        step()
        weights = full_weights(model)
        if rank == 0:
            torch.save(weights, f"{out}/{'resumed' if resume else 'uninterrupted'}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_sharded_checkpoint_resumes_exactly_and_on_one_process(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    for resume in (False, True):
        args = (2, free_port(), tiny_dir, str(tmp_path), resume)
        mp.spawn(checkpointed_process, args=args, nprocs=2)
    uninterrupted = torch.load(tmp_path / "uninterrupted.pt")
    resumed = torch.load(tmp_path / "resumed.pt")
    assert uninterrupted.keys() == resumed.keys()
    for key, value in uninterrupted.items():
        assert torch.equal(resumed[key], value), key  # the same shards, the same steps
    # One process resumes the two's checkpoint: an ordinary model folder, DCP's optimizer
    # state resharded onto a plain AdamW.
    from llm_gym.train.sharding import load_optimizer

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    optimizer = adamw(list(model.parameters()), 1e-3)
    load_optimizer(model, optimizer, tmp_path / "optimizer")
    assert optimizer.state  # AdamW's moments and step, from the shards
    updater = GRPOUpdate(model, optimizer, config("x"), 0)
    tokens, masks = batch(LENGTHS)
    updater(tokens, masks, per_token_advantages(torch.tensor(ADVANTAGES), [len(t) for t in tokens]))
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, uninterrupted[key], atol=1e-6, rtol=0, msg=key)


def saving_process(rank, world, port, folder, out):
    # What a run saves: two checkpoints (the model's dtype, then bfloat16) and the weights a
    # vLLM server is sent; sharded across the processes when there are several.
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm_gym.samplers.weights import write_weights
    from llm_gym.train.checkpoints import save_checkpoint
    from llm_gym.train.sharding import full_weights, shard_model

    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)  # fmt: skip
    try:
        model = AutoModelForCausalLM.from_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        if world > 1:
            shard_model(model)
        tensors = {"rng": torch.get_rng_state()}
        for iteration, dtype in ((1, None), (2, torch.bfloat16)):
            save_checkpoint(out, iteration, model, tokenizer, {"iteration": iteration}, tensors,
                            keep=2, dtype=dtype)  # fmt: skip
        weights = full_weights(model) if world > 1 else None
        if rank == 0:
            write_weights(model, f"{out}/served", weights)
    finally:
        if world > 1:
            dist.destroy_process_group()


@pytest.mark.slow
def test_two_processes_write_tied_weights_as_one_does(smollm2_tokenizer, tmp_path):
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = smollm2_tokenizer
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "tied")
    tok.save_pretrained(tmp_path / "tied")
    for world in (1, 2):
        (tmp_path / str(world) / "served").mkdir(parents=True)
    saving_process(0, 1, None, str(tmp_path / "tied"), str(tmp_path / "1"))
    args = (2, free_port(), str(tmp_path / "tied"), str(tmp_path / "2"))
    mp.spawn(saving_process, args=args, nprocs=2)
    for part in ("checkpoint-1", "checkpoint-2", "served"):
        one = load_file(tmp_path / "1" / part / "model.safetensors")
        two = load_file(tmp_path / "2" / part / "model.safetensors")
        assert sorted(two) == sorted(one), part
        assert all(torch.equal(two[k], v) for k, v in one.items()), part
        # A checkpoint holds the tied embedding once; the served weights hold both (untied).
        assert ("lm_head.weight" in one) == (part == "served"), part
        dtype = torch.bfloat16 if part == "checkpoint-2" else torch.float32
        assert two["model.embed_tokens.weight"].dtype == dtype, part
    assert torch.equal(two["lm_head.weight"], two["model.embed_tokens.weight"])  # served


def game_envs(tokenizer, max_turns, shards=None, num_envs=2):
    from llm_gym.envs import make_textarena_vector_env

    return make_textarena_vector_env(
        num_envs, shards, game="GuessTheNumber-v0", max_turns=max_turns, input_mode="tokens",
        tokenizer=tokenizer, observation_keys=("tokens", "history", "policy_mask"),
    )  # fmt: skip


def greedy(model, tokenizer):
    from llm_gym.policies import TransformersPolicy

    kwargs = {"max_new_tokens": 4, "do_sample": False}
    return TransformersPolicy(model, tokenizer, input_mode="tokens", generate_kwargs=kwargs)


def lockstep_process(rank, world, port, folder, out):
    # The first process's games last up to 3 turns, the second's 1: the second sits the
    # first's later turns out, its shard of every layer gathered for the first's forwards.
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm_gym.episodes import play_episodes
    from llm_gym.train.play import LockStep
    from llm_gym.train.sharding import shard_model

    class Counted(LockStep):
        sat = 0

        def sit_out(self):
            self.sat += 1
            super().sit_out()

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)  # fmt: skip
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = shard_model(AutoModelForCausalLM.from_pretrained(folder))
        policy = greedy(model, tokenizer)
        envs = game_envs(tokenizer, 3 if rank == 0 else 1, shards=(2 * rank, 4))
        peers = Counted(policy, sharded=True)
        obs, _ = envs.reset(seed=0)
        played, _, _ = play_episodes(envs, policy, obs, peers=peers)
        envs.close()
        with open(f"{out}/rank-{rank}.json", "w") as f:
            json.dump(
                {
                    "responses": [list(e.responses) for e in played],
                    "seeds": [e.info["game_seed"] for e in played],
                    "sat": peers.sat,
                },
                f,
            )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_process_whose_games_ended_generates_with_the_others_until_theirs_end(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm_gym.episodes import play_episodes

    mp.spawn(lockstep_process, args=(2, free_port(), tiny_dir, str(tmp_path)), nprocs=2)
    first, second = (json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1))
    turns = [len(r) for r in first["responses"]]
    assert [len(r) for r in second["responses"]] == [1, 1] and max(turns) > 1
    assert (first["sat"], second["sat"]) == (0, max(turns) - 1)
    # Each process played the run's sub-envs 0-1 and 2-3 as one process plays them, and the
    # sharded model generated what the whole one does.
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    policy = greedy(AutoModelForCausalLM.from_pretrained(tiny_dir), tokenizer)
    whole = game_envs(tokenizer, 3, num_envs=4)
    obs, _ = whole.reset(seed=0)
    played, _, _ = play_episodes(whole, policy, obs)
    whole.close()
    responses = [list(e.responses) for e in played]
    assert first["responses"] == responses[:2]
    assert second["responses"] == [r[:1] for r in responses[2:]]  # its games: one turn
    assert first["seeds"] + second["seeds"] == [e.info["game_seed"] for e in played]


def test_a_lock_step_needs_a_policy_that_can_sit_a_turn_out(tiny_dir):
    # A wrapper of the policy (a trainer's sampling under its lock) would leave the other
    # processes' generate waiting for this one's forwards: refused when the model is sharded.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm_gym.train.play import LockStep

    policy = greedy(
        AutoModelForCausalLM.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir)
    )
    LockStep(policy, sharded=True).sit_out()  # a model not sharded: nothing to do
    LockStep(lambda obs: [], sharded=False).sit_out()  # a served policy: nothing to do
    with pytest.raises(TypeError) as refused:
        LockStep(lambda obs: policy(obs), sharded=True)
    assert str(refused.value) == (
        "function cannot sit a turn out (no sit_out, nor a sampler with one), which processes "
        "that generate with one sharded model need when another's episodes go on"
    )
