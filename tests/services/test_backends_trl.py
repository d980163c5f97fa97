"""The TRL bridge samples with TRL's own vLLM generator: ``TRLVLLMSampler`` over TRL 1.16's
``VLLMGeneration`` in server mode, talking through TRL's ``VLLMClient`` to a real vLLM server.

TRL cannot set that generator up on this machine as a trainer would: its constructor refuses to
run where ``vllm`` is not importable (the trainer's environment keeps vLLM out, see README) and
opens an NCCL channel for weight updates, which needs CUDA. So the one step that needs them,
``_init_vllm``, is replaced by the same step without the NCCL channel; ``generate`` (the path
the rollout uses) and the client's HTTP requests are TRL's, unchanged."""

import numpy as np
import pytest
from accelerate import Accelerator
from backend_fixture import FP32_TOLERANCE, prompts_for

from llm_gym.integrations.trl import TRLVLLMSampler
from llm_gym.policies import SamplerPolicy, TransformersPolicy

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def generation(smollm2_tokenizer, default_model, vllm_default):
    from trl.generation import vllm_client, vllm_generation

    server = vllm_default  # the test run's server of the default model

    def connect(self):  # TRL's _init_vllm in server mode, minus init_communicator (NCCL)
        self.vllm_client = vllm_client.VLLMClient(base_url=self.server_base_url)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vllm_client, "is_vllm_available", lambda: True)
        patch.setattr(vllm_generation.VLLMGeneration, "_init_vllm", connect)
        made = vllm_generation.VLLMGeneration(
            default_model[0], Accelerator(cpu=True), smollm2_tokenizer, mode="server",
            server_base_url=server.base_url, temperature=1.0, max_completion_length=20,
        )  # fmt: skip
        yield made


def test_trl_s_generator_samples_token_ids_with_log_probs(generation, smol):
    model, tokenizer = smol
    sampler = TRLVLLMSampler(generation, tokenizer.eos_token_id, version=3)
    prompts = prompts_for(tokenizer)
    samples = sampler.sample(prompts)
    scored = TransformersPolicy(model, tokenizer, input_mode="tokens", generate=False).score(
        prompts, [s.tokens for s in samples]
    )
    for s, reference in zip(samples, scored, strict=True):
        assert s.tokens.dtype == np.int64 and 1 <= len(s.tokens) <= 20 and s.version == 3
        assert s.finish_reason == ("stop" if s.tokens[-1] == tokenizer.eos_token_id else "length")
        # TRL's server mode asks for temperature-processed log-probs; at temperature 1 they
        # are the raw ones.
        assert np.abs(s.log_probs - reference).max() < FP32_TOLERANCE
    # As a policy over observations: the ids TRL returned, decoded only for the text.
    response = SamplerPolicy(sampler, tokenizer)({"tokens": prompts[0]})
    assert response.text == tokenizer.decode(response.tokens, skip_special_tokens=False)


def test_the_rollout_func_samples_with_the_trainers_vllm_when_use_vllm(generation, smol, tmp_path):
    import datasets
    from trl import GRPOConfig, GRPOTrainer

    from llm_gym.integrations.trl import env_reward_func, make_rollout_func
    from llm_gym.lm.loading import tiny_model

    model, tokenizer = smol
    args = GRPOConfig(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, num_generations=2,
        max_completion_length=20, use_cpu=True, bf16=False, report_to="none",
        save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    # A real trainer over a random tiny model, built without vLLM (which cannot start here),
    # then given the generator TRL builds for use_vllm=True: the rollout must sample with it.
    trainer = GRPOTrainer(
        model=tiny_model(tokenizer, seed=0), reward_funcs=[env_reward_func], args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": ["x"] * 4}),
        processing_class=tokenizer,
    )  # fmt: skip
    trainer.args.use_vllm, trainer.vllm_generation = True, generation
    rollout = make_rollout_func("LLMChat-ReasoningGym-v0", task="chain_sum")
    out = rollout(["x"] * 4, trainer)
    served = TransformersPolicy(model, tokenizer, input_mode="tokens", generate=False)
    tiny = TransformersPolicy(trainer.model, tokenizer, input_mode="tokens", generate=False)
    prompts = [np.asarray(p) for p in out["prompt_ids"]]
    completions = [np.asarray(c) for c in out["completion_ids"]]
    for scorer, close in ((served, True), (tiny, False)):
        for logprobs, reference in zip(
            out["logprobs"], scorer.score(prompts, completions), strict=True
        ):
            assert bool(np.abs(np.asarray(logprobs) - reference).max() < FP32_TOLERANCE) == close
