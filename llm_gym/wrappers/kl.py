"""The KL path: TorchRL's RetrieveLogProb, KLComputation, RetrieveKL and KLRewardTransform as
Gymnasium wrappers for any chat env, over one batched path for the log-prob retrieval and the KL
charge of N responses (``KLCharge``, ``retrieve``, ``with_retrievers``; a single env's step is a
batch of one, only ``info``'s layout differs). The vector versions are in ``vector/kl.py``."""

from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import gymnasium as gym
import numpy as np

from llm_gym.chat.containers import Response
from llm_gym.checks import check_number
from llm_gym.envs import batch_infos, single_env
from llm_gym.samplers import Scorer, check_scorer, response_log_probs
from llm_gym.wrappers.controllers import ConstantKLController, KLController
from llm_gym.wrappers.estimators import check_estimator, kl_estimate

if TYPE_CHECKING:
    from gymnasium.vector import VectorEnv

    from llm_gym.policies.base import Action
    from llm_gym.samplers.base import ScoredResponse

__all__ = [
    "KLCharge",
    "KLComputation",
    "KLRewardWrapper",
    "RetrieveKL",
    "RetrieveLogProb",
    "check_tokenizer",
    "retrieve",
    "tokenizer_mismatch",
    "with_retrievers",
]

Step = tuple[Any, Any, Any, Any, dict[str, Any]]
# Gymnasium's reset keywords, passed through: ``seed`` (a vector env's: one per sub-env, or
# one for all) and ``options``.
ResetArgument = int | list[int | None] | dict[str, Any] | None


def as_batch(
    env: gym.Env | VectorEnv, actions: Action | Sequence[Action], batched: bool
) -> list[Action]:
    """A vector env's N actions (counted) or a single env's one, as a list."""
    if not batched:
        return [actions]
    if len(actions) != env.num_envs:
        raise ValueError(f"actions must hold {env.num_envs} responses, got {len(actions)}")
    return list(actions)


def as_response(action: Action) -> ScoredResponse:
    """Dict actions become Responses; str, arrays and Responses pass through."""
    return Response.from_mapping(dict(action)) if isinstance(action, Mapping) else action


def check_finite(log_probs: np.ndarray, what: str, env_index: int | None) -> np.ndarray:
    """``log_probs`` if every value is finite; else an error naming the env and the token.

    A ``-inf`` log-prob makes k1's KL ``+inf`` and k3's NaN, which would then set an
    adaptive coefficient to NaN for good.
    """
    bad = np.flatnonzero(~np.isfinite(log_probs))
    if bad.size:
        where = "" if env_index is None else f"sub-env {env_index}: "
        raise ValueError(
            f"{where}{what} must be finite, got {log_probs[bad[0]]} at response token "
            f"{bad[0]} ({bad.size} non-finite of {len(log_probs)}): a sampler that masks "
            "tokens (top-k/top-p) must report the raw model's log-probs"
        )
    return log_probs


class LogProbRetriever(Protocol):
    """What ``retrieve`` reads of a ``RetrieveLogProb``, single or vector (a Protocol, so that
    this module does not import the vector one, which imports it)."""

    env: gym.Env | VectorEnv
    model: Scorer
    log_prob_key: str
    assistant_only: bool
    _prompt: Mapping[str, object] | None


def retrieve(
    wrapper: LogProbRetriever,
    actions: Action | Sequence[Action],
    batched: bool,
) -> Step:
    """``RetrieveLogProb.step`` (single or vector): score each response given the prompt the
    env showed (one forward for the batch), step the env, put the scores in ``info[key]``.

    Scored before the env steps, so a response the model rejects changes nothing.
    """
    if wrapper._prompt is None:
        raise gym.error.ResetNeeded("Cannot call step before reset")
    env, key = wrapper.env, wrapper.log_prob_key
    actions = as_batch(env, actions, batched)
    scored = response_log_probs(
        wrapper.model,
        wrapper._prompt,
        [as_response(a) for a in actions],
        batched=batched,
        assistant_only=wrapper.assistant_only,
    )
    where = f"info[{key!r}]"
    parts = [{key: check_finite(lp, where, i if batched else None)} for i, lp in enumerate(scored)]
    obs, rewards, terminated, truncated, info = env.step(actions if batched else actions[0])
    info.update(batch_infos(parts) if batched else parts[0])  # stacked over sub-envs
    wrapper._prompt = obs
    return obs, rewards, terminated, truncated, info


def provides_key(env: gym.Env | VectorEnv | None, key: str) -> bool:
    """Whether a RetrieveLogProb (or vector version) below ``env`` writes ``info[key]``."""
    while env is not None:
        if getattr(env, "log_prob_key", None) == key:
            return True
        env = getattr(env, "env", None)
    return False


# Each tokenizer's (size, hash of its token -> id map), computed once per tokenizer object
# (weakly held): the sub-envs of a vector env share theirs, a vocabulary costs ~15 ms.
_vocab_hashes: weakref.WeakKeyDictionary[Any, tuple[int, int]] = weakref.WeakKeyDictionary()


def _vocab_hash(tokenizer: Any) -> tuple[int, int]:
    size = len(tokenizer)
    known = _vocab_hashes.get(tokenizer)
    if known is None or known[0] != size:  # new, or tokens were added since
        known = (size, hash(frozenset(tokenizer.get_vocab().items())))
        _vocab_hashes[tokenizer] = known
    return known


def _vocab_difference(a: Any, b: Any) -> str:
    tokens_a = {i: t for t, i in a.get_vocab().items()}
    tokens_b = {i: t for t, i in b.get_vocab().items()}
    differ = sorted(
        i for i in tokens_a.keys() | tokens_b.keys() if tokens_a.get(i) != tokens_b.get(i)
    )
    first = differ[0]
    return (
        f"the vocabularies differ: {len(tokens_a)} vs {len(tokens_b)} tokens, {len(differ)} ids "
        f"name other tokens (id {first} is {tokens_a.get(first)!r} vs {tokens_b.get(first)!r})"
    )


def tokenizer_mismatch(a: Any, b: Any, *, pad: bool = False) -> str | None:
    """What differs between tokenizers ``a`` and ``b`` such that one's token ids mean other
    tokens to the other: the vocabulary (token -> id), the eos and bos ids, and the pad ids
    where both have one (always with ``pad=True``: two scorers padding one batch must pad
    alike); None when nothing does.

    >>> from llm_gym.lm.loading import load_gpt2_tokenizer
    >>> gpt2 = load_gpt2_tokenizer()
    >>> tokenizer_mismatch(gpt2, gpt2) is None
    True
    """
    if a is b:
        return None
    problems = []
    if _vocab_hash(a) != _vocab_hash(b):
        problems.append(_vocab_difference(a, b))
    for name in ("eos_token_id", "bos_token_id", "pad_token_id"):
        mine, theirs = getattr(a, name, None), getattr(b, name, None)
        unset = name == "pad_token_id" and not pad and None in (mine, theirs)
        if mine != theirs and not unset:
            problems.append(f"{name} {mine} vs {theirs}")
    return "; ".join(problems) or None


def _tokenizer_name(tokenizer: Any) -> str:
    return f"{type(tokenizer).__name__}({getattr(tokenizer, 'name_or_path', '')!r})"


def env_tokenizer(env: gym.Env | VectorEnv) -> Any:
    """The tokenizer of ``env``'s task (through wrappers; a vector env's single env), or None
    where it has none (history mode) or it cannot be reached (AsyncVectorEnv)."""
    base = env.unwrapped
    if isinstance(base, gym.vector.VectorEnv):
        try:
            base = single_env(base).unwrapped
        except (AttributeError, IndexError):
            return None
    return getattr(base, "tokenizer", None)


def check_tokenizer(env: gym.Env | VectorEnv, model: object, argument: str) -> None:
    """A ValueError naming both tokenizers and what differs when ``model`` (a scorer with a
    ``tokenizer``) tokenizes otherwise than ``env``: it would score the env's token ids as
    other tokens (a GPT-2 reference against SmolLM2 gave 9-10 nats of KL a token)."""
    mine, theirs = env_tokenizer(env), getattr(model, "tokenizer", None)
    if mine is None or theirs is None:
        return
    problem = tokenizer_mismatch(mine, theirs)
    if problem is not None:
        raise ValueError(
            f"{argument} must use the env's tokenizer, or it scores other tokens than the "
            f"policy sampled: the env's is {_tokenizer_name(mine)}, {argument}'s "
            f"{_tokenizer_name(theirs)}, and {problem}"
        )


# The reference models warned about scoring below float32 (weakly held: they may go).
_warned_low_precision: weakref.WeakSet[Any] = weakref.WeakSet()


def with_retrievers(
    env: gym.Env | VectorEnv,
    retriever: Callable[..., gym.Env | VectorEnv],
    gen_model: Scorer | None,
    ref_model: Scorer | None,
    keys: tuple[str, str],
    assistant_only: bool,
) -> gym.Env | VectorEnv:
    """``env`` wrapped in ``retriever`` (``RetrieveLogProb`` or its vector version) for the
    generator, if given, then the reference, writing ``keys`` (gen, ref). Both models must
    score, and tokenize as the env does and pad alike, or their log-probs would not align
    (``tokenizer_mismatch`` says what differs)."""
    if ref_model is None:
        raise ValueError("ref_model is required: the model the KL is measured against")
    check_scorer(ref_model, "ref_model")
    if gen_model is not None:
        check_scorer(gen_model, "gen_model")
        gen_tok, ref_tok = (getattr(m, "tokenizer", None) for m in (gen_model, ref_model))
        if gen_tok is not None and ref_tok is not None:
            problem = tokenizer_mismatch(gen_tok, ref_tok, pad=True)
            if problem is not None:
                raise ValueError(
                    "gen_model and ref_model must share a tokenizer and padding convention: "
                    f"gen_model's is {_tokenizer_name(gen_tok)}, ref_model's "
                    f"{_tokenizer_name(ref_tok)}, and {problem}"
                )
        check_tokenizer(env, gen_model, "gen_model")
    check_tokenizer(env, ref_model, "ref_model")
    if gen_model is None:
        # Log-probs from generation against a reference below float32: their difference is
        # then mostly rounding noise. Said once per reference model (torch module).
        model = getattr(ref_model, "model", None)  # a TransformersPolicy's torch model
        dtype = str(getattr(model, "dtype", ""))
        if dtype in ("torch.bfloat16", "torch.float16") and model not in _warned_low_precision:
            _warned_low_precision.add(model)
            warnings.warn(
                f"the reference model scores in {dtype.removeprefix('torch.')}, below float32, "
                "and the generator's log-probs come from generation: between a model and "
                "itself k1's mean |KL| measured 0.027 in bfloat16 against 1.5e-6 in float32. "
                "Pass gen_model= (RetrieveKL) to re-score the responses with the generator in "
                "the same forward as the reference, or score in float32.",
                UserWarning,
                stacklevel=3,
            )
        return retriever(env, ref_model, keys[1], assistant_only)
    env = retriever(env, gen_model, keys[0], assistant_only)
    return retriever(env, ref_model, keys[1], assistant_only)


class KLCharge:
    """A KL wrapper's settings, its coefficient (``controller``) with the KL rewards
    (``-kl_penalty``) collected since the controller's last update, and the charge of a batch.

    ``env``: the env a ``KLComputation`` wraps, which must hold a ``RetrieveLogProb`` writing
    ``ref_key``; None for a wrapper that scores by itself (``TokenKLWrapper``).
    """

    def __init__(
        self,
        env: gym.Env | VectorEnv | None,
        gen_key: str,
        ref_key: str,
        coef: float,
        estimator: str,
        add_to_reward: bool,
        kl_key: str,
        kl_controller: KLController | None,
    ) -> None:
        check_estimator(estimator)
        controller = kl_controller
        if kl_controller is None:
            controller = ConstantKLController(check_number("coef", coef, 0))
        if not isinstance(controller, KLController):
            raise TypeError(
                f"kl_controller must be a KLController, got {type(controller).__name__}"
            )
        if env is not None and not provides_key(env, ref_key):
            raise ValueError(
                f"KLComputation reads info[{ref_key!r}]: wrap the env in "
                f"RetrieveLogProb(env, ref_model, key={ref_key!r}) first (or use RetrieveKL)"
            )
        self.controller, self.kl_rewards = controller, []
        self.gen_key, self.ref_key, self.kl_key = gen_key, ref_key, kl_key
        self.estimator, self.add_to_reward = estimator, add_to_reward
        self.gen_from_info = env is not None and provides_key(env, gen_key)
        # What KLComputation records as its constructor arguments.
        self.arguments = {
            "gen_key": gen_key,
            "ref_key": ref_key,
            "coef": coef,
            "estimator": estimator,
            "add_to_reward": add_to_reward,
            "kl_key": kl_key,
            "kl_controller": kl_controller,
        }

    def __copy__(self) -> KLCharge:
        # A forked env's charge (llm_gym.fork): its own coefficient and collected rewards.
        other = object.__new__(KLCharge)
        other.__dict__.update(self.__dict__)
        other.controller, other.kl_rewards = copy.copy(self.controller), list(self.kl_rewards)
        return other

    @property
    def coef(self) -> float:
        """The coefficient the next charge uses."""
        return self.controller.coef

    def update(self) -> float:
        """The controller's update from the KL rewards collected since the last one."""
        values, self.kl_rewards = self.kl_rewards, []
        if not values:
            raise ValueError("update_kl_coef needs at least one step since the last update")
        return self.controller.update(values)

    def step(
        self, env: gym.Env | VectorEnv, actions: Action | Sequence[Action], batched: bool
    ) -> Step:
        """Step ``env`` and charge each response's KL: ``info`` gets the generator's
        log-probs, the per-token KL, ``kl_penalty``, the ``kl_coef`` it was charged under and
        ``token_rewards``."""
        actions = as_batch(env, actions, batched)
        # The log-probs the actions carry, unless an inner wrapper supplies them; checked
        # before the env steps, so a missing one changes nothing.
        gens = (
            []
            if self.gen_from_info
            else [self._carried(a, i if batched else None) for i, a in enumerate(actions)]
        )
        obs, rewards, terminated, truncated, info = env.step(actions if batched else actions[0])
        # Per env: a vector env's arrays over sub-envs, a single env's values as a batch of one.
        column = list if batched else (lambda value: [value])
        gens = gens or column(info[self.gen_key])
        parts = self.charge(gens, column(info[self.ref_key]), column(rewards))
        info.update(batch_infos(parts) if batched else parts[0])
        if self.add_to_reward:
            penalties = [part["kl_penalty"] for part in parts]
            if batched:
                rewards = (np.asarray(rewards, np.float64) - penalties).astype(rewards.dtype)
            else:
                rewards = float(rewards) - penalties[0]
        return obs, rewards, terminated, truncated, info

    def _carried(self, action: Action, env_index: int | None) -> np.ndarray:
        log_probs = getattr(as_response(action), "log_probs", None)
        if log_probs is None:
            raise ValueError(
                f"the generator's log-probs are missing: the action ({type(action).__name__}) "
                "carries none. Pass a Response with log_probs (TransformersPolicy with "
                f"return_log_probs=True), or wrap the env in RetrieveLogProb(env, gen_model, "
                f"key={self.gen_key!r}) / RetrieveKL(env, gen_model=..., ref_model=...)"
            )
        values = np.asarray(log_probs, dtype=np.float32)
        return check_finite(values, "the action's Response.log_probs", env_index)

    def charge(
        self,
        gens: Sequence[np.ndarray],
        refs: Sequence[np.ndarray],
        rewards: Sequence[float] | np.ndarray,
    ) -> list[dict]:
        """Per env: the info entries (gen log-probs, per-token KL, penalty, token rewards)."""
        coef, parts = self.coef, []
        for gen, ref, reward in zip(gens, refs, rewards, strict=True):
            if len(gen) != len(ref):
                raise ValueError(
                    f"generator and reference log-probs differ in length ({len(gen)} vs "
                    f"{len(ref)} tokens): the two models did not score the same response "
                    "tokens. A common cause is pad_token == eos_token with padding masked by "
                    "token id, which drops the EOS."
                )
            kl = kl_estimate(gen, ref, self.estimator)
            token_rewards = (-coef * kl).astype(np.float32)
            if len(token_rewards):  # TorchRL's: the task reward lands on the last token
                token_rewards[-1] += float(reward)
            parts.append(
                {
                    self.gen_key: gen,
                    self.kl_key: kl,
                    "kl_penalty": float(coef * kl.sum(dtype=np.float64)),
                    "kl_coef": float(coef),  # what this response was charged under
                    "token_rewards": token_rewards,
                }
            )
        self.kl_rewards.extend(-part["kl_penalty"] for part in parts)
        return parts


class RetrieveLogProb(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Put a model's log-probs of each step's response tokens into ``info[key]``.

    Args:
        env: a chat env (its observations hold the model's input mode).
        model: a scorer: a log-prob-mode ``TransformersPolicy``, or a ``RayLogProbModel``,
            with the env's tokenizer (another vocabulary or eos/bos/pad ids: a ValueError
            naming both tokenizers, see ``tokenizer_mismatch``).
        key: the info key (``"ref_log_probs"``; ``"log_probs"`` for the generator).
        assistant_only: True (default): this step's response tokens only, one value per
            sampled token. False: every token of prompt plus response (first token 0.0).
    """

    def __init__(
        self, env: gym.Env, model: Scorer, key: str = "ref_log_probs", assistant_only: bool = True
    ) -> None:
        gym.utils.RecordConstructorArgs.__init__(
            self, _disable_deepcopy=True, model=model, key=key, assistant_only=assistant_only
        )
        gym.Wrapper.__init__(self, env)
        self.model = check_scorer(model, "model")
        check_tokenizer(env, model, "model")
        self.log_prob_key, self.assistant_only = key, assistant_only
        self._prompt: Any = None  # the observation the next action answers

    def reset(self, **kwargs: ResetArgument) -> tuple[Any, dict[str, Any]]:
        """Reset the env and keep its observation(s), the prompt(s) the next step answers."""
        self._prompt, info = self.env.reset(**kwargs)
        return self._prompt, info

    def step(self, action: Action) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Score the action's response, then step the env; ``info[key]`` holds the scores."""
        return retrieve(self, action, batched=False)


class KLComputation(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Per-token KL from ``info[gen_key]`` and ``info[ref_key]``; optionally a reward penalty.

    ``info`` gets ``kl_key``, ``kl_penalty`` (``coef · Σ kl``) and ``token_rewards``, as
    docs/kl.md says. When no inner ``RetrieveLogProb`` writes ``gen_key``, the generator's
    log-probs come from the action ``Response``. ``charge`` holds the settings and coefficient.

    Args:
        env: an env wrapped in ``RetrieveLogProb(..., key=ref_key)``.
        gen_key / ref_key: info keys of the generator's and the reference's log-probs.
        coef: KL coefficient (ignored when ``kl_controller`` is given).
        estimator: ``"k1"`` (log p − log q, TorchRL's), ``"k2"`` or ``"k3"``.
        add_to_reward: subtract the penalty from the reward.
        kl_key: info key of the per-token KL.
        kl_controller: a ``ConstantKLController``/``AdaptiveKLController``; call
            ``update_kl_coef()`` (``env.get_wrapper_attr("update_kl_coef")()``) to update it.
    """

    def __init__(
        self,
        env: gym.Env,
        gen_key: str = "log_probs",
        ref_key: str = "ref_log_probs",
        coef: float = 1.0,
        estimator: str = "k1",
        add_to_reward: bool = True,
        kl_key: str = "kl",
        kl_controller: KLController | None = None,
    ) -> None:
        # Checks the settings before anything changes.
        self.charge = KLCharge(
            env, gen_key, ref_key, coef, estimator, add_to_reward, kl_key, kl_controller
        )
        gym.utils.RecordConstructorArgs.__init__(
            self, _disable_deepcopy=True, **self.charge.arguments
        )
        gym.Wrapper.__init__(self, env)

    # Every KL wrapper (single, vector, TokenKLWrapper) keeps its settings and coefficient in
    # self.charge and takes these three accessors from here.
    @property
    def kl_controller(self) -> KLController:
        """The controller that sets ``coef``."""
        return self.charge.controller

    @property
    def coef(self) -> float:
        """The KL coefficient the next step charges."""
        return self.charge.coef

    def update_kl_coef(self) -> float:
        """Update the coefficient from the KL rewards (``-kl_penalty``) of the steps since the
        last update, and return it. Call it at your update point, e.g. after each batch."""
        return self.charge.update()

    def step(self, action: Action) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Step the env and charge the response's KL (see the class docstring)."""
        return self.charge.step(self.env, action, batched=False)


class RetrieveKL(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """``RetrieveLogProb`` for the generator (optional) and the reference, then
    ``KLComputation``, in one wrapper (its ``env`` is that ``KLComputation``).

    ``gen_model`` may be omitted when the actions are Responses that carry their log-probs
    (what ``TransformersPolicy`` returns). ``assistant_only`` as ``RetrieveLogProb``'s; the
    other arguments and the accessors as ``KLComputation``'s.
    """

    def __init__(
        self,
        env: gym.Env,
        gen_model: Scorer | None = None,
        ref_model: Scorer | None = None,
        *,
        assistant_only: bool = True,
        gen_key: str = "log_probs",
        ref_key: str = "ref_log_probs",
        coef: float = 1.0,
        estimator: str = "k1",
        add_to_reward: bool = True,
        kl_key: str = "kl",
        kl_controller: KLController | None = None,
    ) -> None:
        keys = (gen_key, ref_key)
        env = with_retrievers(env, RetrieveLogProb, gen_model, ref_model, keys, assistant_only)
        env = KLComputation(
            env, gen_key, ref_key, coef, estimator, add_to_reward, kl_key, kl_controller
        )
        self.charge = env.charge
        models = {"gen_model": gen_model, "ref_model": ref_model, "assistant_only": assistant_only}
        gym.utils.RecordConstructorArgs.__init__(
            self, _disable_deepcopy=True, **models, **self.charge.arguments
        )
        gym.Wrapper.__init__(self, env)

    kl_controller = KLComputation.kl_controller
    coef = KLComputation.coef
    update_kl_coef = KLComputation.update_kl_coef


class KLRewardWrapper(RetrieveKL):
    """TorchRL's legacy ``KLRewardTransform``: ``reward -= coef · Σ (log p − log q)`` with the
    generator's log-probs taken from the action ``Response`` and the reference scored here.

    Other keyword arguments as ``RetrieveKL``; docs/kl.md has an example.
    """

    def __init__(
        self,
        env: gym.Env,
        ref_model: Scorer,
        coef: float = 1.0,
        **options: bool | str | float | KLController | None,
    ) -> None:
        gym.utils.RecordConstructorArgs.__init__(
            self, _disable_deepcopy=True, ref_model=ref_model, coef=coef, **options
        )
        super().__init__(env, None, ref_model, coef=coef, **options)
