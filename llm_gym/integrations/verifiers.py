"""llm_gym's envs as verifiers environments (the ``verifiers`` extra).

``load_environment(env_id, **args)`` is the hook verifiers looks for in an environment
module, so verifiers' own tools load any registered id from here::

    vf-eval llm_gym.integrations.verifiers -a '{"gym_id": "LLMChat-Countdown-v0"}' \\
        -b http://127.0.0.1:8000/v1 -m MODEL -n 8

and ``vf.load_environment("llm_gym.integrations.verifiers", gym_id=...)`` does the same in
Python. The other way round, ``gym.make("LLMChat-Verifiers-v0", environment=...)`` plays a
verifiers environment (``llm_gym.envs.verifiers``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from llm_gym.checks import check_int
from llm_gym.tools.calls import chat_messages

if TYPE_CHECKING:
    from verifiers import MultiTurnEnv

__all__ = ["load_environment"]


def load_environment(
    gym_id: str,
    num_examples: int = 100,
    seed: int = 0,
    max_turns: int = -1,
    env_args: Mapping[str, object] | None = None,
    **more_env_args: object,
) -> MultiTurnEnv:
    """``gym_id`` (any registered llm_gym id) as a verifiers ``MultiTurnEnv``.

    (Not ``env_id``: verifiers' own ``load_environment(env_id, **args)`` takes that name
    for the module.)

    - **Dataset**: ``num_examples`` rows, row ``i`` the episode ``gym.make(gym_id,
      **env_args).reset(seed=seed + i)`` starts (its ``prompt`` the first observation's
      ``history``, system prompt included; ``info`` its ``gym_id`` and ``seed``; ``answer``
      the sample's answer when it has one). The same rows serve as the eval dataset.
    - **Turns**: each rollout holds an env of its own, reset with its row's seed; each
      model reply is one ``env.step(text)``, and the messages the env adds after it (the
      next user turn; tool output, as user messages) are the environment's response. The
      env's ``terminated``/``truncated`` end the rollout (``max_turns`` -1: no other
      limit). A reply the env refuses by raising (a text over its ``max_text_length``)
      ends the rollout with reward 0 and the error in ``state["llm_gym_error"]``.
    - **Rubric**: one reward function, ``env_reward``: the episode's return (the sum of
      its steps' rewards), so verifiers' reward is llm_gym's reward.

    ``env_args`` (a dict, as ``vf-eval -a`` passes nested JSON) and any other keyword go to
    ``gym.make``. The env must give ``history`` observations (its default ``input_mode``).

    >>> import verifiers as vf
    >>> env = vf.load_environment(
    ...     "llm_gym.integrations.verifiers", gym_id="LLMChat-Countdown-v0", num_examples=3
    ... )
    >>> type(env).__name__, len(env.get_eval_dataset())
    ('GymEnvironment', 3)
    >>> env.get_eval_dataset()[0]["info"]
    {'gym_id': 'LLMChat-Countdown-v0', 'seed': 0}
    """
    import verifiers as vf
    from datasets import Dataset

    env_id = gym_id

    num_examples = check_int("num_examples", num_examples, 1)
    seed = check_int("seed", seed, 0)
    max_turns = check_int("max_turns", max_turns, -1)
    if env_args is not None and not isinstance(env_args, Mapping):
        raise TypeError(f"env_args must be a dict or None, got {type(env_args).__name__}")
    make_args = {**dict(env_args or {}), **more_env_args}
    probe = gym.make(env_id, **make_args)  # a bad id or argument fails here, as gym.make's
    try:
        rows = []
        for index in range(num_examples):
            observation, info = probe.reset(seed=seed + index)
            prompt = _history(observation, env_id)
            answer = info.get("answer", info.get("item", {}).get("answer", ""))
            row_info = {"gym_id": env_id, "seed": seed + index}
            rows.append({"prompt": prompt, "answer": str(answer), "info": row_info})
    finally:
        probe.close()
    dataset = Dataset.from_list(rows)

    class GymEnvironment(vf.MultiTurnEnv):
        """One llm_gym env per rollout; its steps are the environment's responses."""

        async def setup_state(self, state: vf.State) -> vf.State:
            env = gym.make(env_id, **make_args)
            env.reset(seed=int(state["info"]["seed"]))
            state["llm_gym_env"], state["llm_gym_return"] = env, 0.0
            return state

        async def env_response(self, messages: vf.Messages, state: vf.State) -> vf.Messages:
            env = state["llm_gym_env"]
            text = chat_messages(messages[-1:])[0]["content"]
            try:
                observation, reward, terminated, truncated, _ = env.step(text)
            except Exception as error:  # a refused reply ends the episode, never the eval
                state["llm_gym_error"] = f"{type(error).__name__}: {error}"[:2000]
                state["final_env_response"] = []
                return []
            state["llm_gym_return"] += float(reward)
            # A tool's output comes as a user message: the reply's calls were text, so an
            # OpenAI tool message would answer no tool_call id.
            added = [
                vf.UserMessage(content=m["content"])
                for m in _history(observation, env_id)[len(messages) :]
            ]
            if terminated or truncated:
                state["final_env_response"] = added
            return added

        @vf.cleanup
        async def close_env(self, state: vf.State) -> None:
            env = state.pop("llm_gym_env", None)
            if env is not None:
                env.close()

    async def env_reward(state: vf.State) -> float:
        """The llm_gym episode's return."""
        return float(state.get("llm_gym_return", 0.0))

    # No env_id/env_args here: vf.load_environment records its module and arguments, which
    # verifiers' env server (vf-eval's workers) loads again in a process of its own.
    rubric = vf.Rubric(funcs=[env_reward])
    return GymEnvironment(dataset=dataset, eval_dataset=dataset, rubric=rubric, max_turns=max_turns)


def _history(observation: Mapping[str, Any], env_id: str) -> list[dict[str, str]]:
    if "history" not in observation:
        raise ValueError(
            f"{env_id}'s observations need a 'history' key for verifiers (input_mode "
            f"'history'); its keys are {sorted(observation)}"
        )
    return [{"role": m["role"], "content": m["content"]} for m in observation["history"]]
