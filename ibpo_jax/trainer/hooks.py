"""The trainer's hooks: the plug-in interface of the methods that add a stage to the RL step
(DESIGN §6-§7). The methods themselves (`ibpo_jax/methods/`) sit above the trainer and
implement these; the trainer reaches them only through `registry.METHODS`.

A method is a `Method` subclass registered in `registry.METHODS` (name -> class, the class being
its factory). A config turns it on through its own section (`Method.enabled`, e.g.
`config.prm.weight > 0`); `RunConfig.methods` lists the names turned on and `Method.check` adds
the method's checks that span sections. The trainer builds each with a `Context`, what a
method may use of the run (never the trainer itself), and calls it at fixed points of every
RL step through `Methods`, by the small protocols it implements:

    before RL      `Preparer.prepare`        e.g. fit a PRM; its cost goes to the budget
    after scoring  `RewardShaper.shape`      the scored batch -> shaped batch + metrics
                   `ExtraRound.extend`       an extra round's rows, appended to the update's
                                             (at most one method per run has one)
    evaluation     `Answerer.answer`         the method's answer when it is not the first
                                             response (SCoRe's second attempt)

Credit, advantages and the update stay the core's (`trainer/rl_step.py`): a method changes what
they see (rewards, rows), never how they compute.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import jax
import numpy as np

from ibpo_jax import models
from ibpo_jax.config import RunConfig
from ibpo_jax.config.registry import METHODS
from ibpo_jax.sampler import sampling
from ibpo_jax.trainer import batching, rounds
from ibpo_jax.trainer.credit import Rollout
from ibpo_jax.trainer.rounds import FirstRound, Round


@dataclasses.dataclass(frozen=True)
class Context:
    """What a method sees of its run, fixed for the run."""

    cfg: RunConfig
    mesh: jax.sharding.Mesh
    tokenizer: Any
    task: Any  # the training task (`data.Task`): prompts, reward family
    eval_task: Any
    train_records: Sequence[dict]
    model: models.Qwen3Config
    options: models.ModelOptions
    base_params: Any  # the frozen base policy (π_ref, also PRM+GSPO's backbone), on the mesh
    is_delim: jax.Array  # [V] bool: the tokens that end a reasoning step
    pool: Any  # rewards.RewardPool of the training task
    eval_pool: Any  # of the evaluation task
    workdir: Path
    is_main: bool  # process 0 (writes files)

    def sampler(self, num_samples: int, *, evaluation: bool = False) -> sampling.GenerateFn:
        """The run's sampler with the rollout's (or the evaluation's) settings."""
        return batching.sampler(self.cfg, self.model, self.options, self.tokenizer, self.mesh,
                                num_samples=num_samples, evaluation=evaluation)

    def score_mine(self, records: Sequence[dict], tokens: np.ndarray, lengths: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        """(reward, correct, ended, reports) of rows this process holds."""
        return batching.score_rows(self.pool, self.tokenizer, records, tokens, lengths)

    def score_shared(self, records: Sequence[dict], tokens: np.ndarray, lengths: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(reward, correct, ended) of rows every process holds, each scoring a share."""
        return batching.score_all_rows(self.pool, self.tokenizer, records, tokens, lengths)

    def sample_round(self, params: Any, texts: list[str], width: int, key: jax.Array, n: int,
                     *, evaluation: bool = False) -> rounds.Sampled:
        """One response of the policy `params` to each prompt text (`rounds.sample`), with
        the rollout's sampler settings (`evaluation`: the evaluation's)."""
        return rounds.sample(self.sampler(1, evaluation=evaluation), params, self.tokenizer,
                             texts, width=width, key=key, n=n, mesh=self.mesh,
                             response_width=self.cfg.rollout.max_new_tokens)


@dataclasses.dataclass(frozen=True)
class Scored:
    """An RL step's scored first round, as the methods see it."""

    step: int  # the RL step, 1-based
    records: list[dict]  # [B] the step's problems
    rollout: Rollout  # [N = B·G] rows on the mesh, prompt-major
    rows: np.ndarray  # the rows this process scored
    infos: list[dict]  # the verifier's reports of those rows
    params: Any  # the policy that sampled the batch


@runtime_checkable
class Preparer(Protocol):
    def prepare(self, fresh: bool, log: Callable[[str], None]
                ) -> tuple[float, dict[str, float]]:
        """Before RL (`fresh`: a new run, else a resumed one): (trajectories sampled, to charge
        to the budget of a fresh run; metrics of its step-0 row)."""


@runtime_checkable
class RewardShaper(Protocol):
    def shape(self, batch: Scored) -> tuple[Scored, dict[str, float]]:
        """The batch with its rewards changed before the credit, and the step's metrics."""


@runtime_checkable
class ExtraRound(Protocol):
    def extend(self, batch: Scored, first: FirstRound, key: jax.Array) -> Round:
        """The rows this method appends to the step's update (`rounds.Round`), from the scored
        first round (`first`: its rows on the host) and a key of its own."""


@runtime_checkable
class Answerer(Protocol):
    def answer(self, params: Any, records: list[dict], texts: list[str], key: jax.Array
               ) -> np.ndarray:
        """Evaluation: whether the method's answer after each first response `texts[i]` to
        `records[i]` is correct, [n] bool (then the first responses' accuracy is logged as
        eval_accuracy_attempt1)."""


class Method:
    """Base of the registered methods (`registry.METHODS`): when a config turns one on, and
    its checks. Subclasses implement one or more of the protocols above."""

    switch: ClassVar[str] = ""  # the config key that turns it on, named in messages
    trajectories_per_row: ClassVar[int] = 0  # per first-round row, every step (fixed rounds)

    def __init__(self, ctx: Context):
        self.ctx = ctx

    @classmethod
    def enabled(cls, cfg: RunConfig) -> bool:
        raise NotImplementedError(f"{cls.__name__}.enabled")

    @classmethod
    def check(cls, cfg: RunConfig) -> None:
        """Checks of a config that turns the method on, across sections (ConfigError)."""

    @classmethod
    def adds_round(cls) -> bool:
        return issubclass(cls, ExtraRound)


class Methods:
    """The methods a run turns on (`RunConfig.methods`, in name order), called at the RL
    step's fixed points."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.active = [METHODS.get(name)(ctx) for name in ctx.cfg.methods]

    def prepare(self, fresh: bool, log: Callable[[str], None]
                ) -> tuple[float, dict[str, float]]:
        cost, metrics = 0.0, {}
        for m in self.active:
            if isinstance(m, Preparer):
                c, more = m.prepare(fresh, log)
                cost, metrics = cost + c, {**metrics, **more}
        return cost, metrics

    def shape(self, batch: Scored) -> tuple[Scored, dict[str, float]]:
        metrics = {}
        for m in self.active:
            if isinstance(m, RewardShaper):
                batch, more = m.shape(batch)
                metrics.update(more)
        return batch, metrics

    def extend(self, batch: Scored, key: jax.Array) -> tuple[FirstRound, Round] | None:
        """The first round on the host and the extra round's rows, or None (no extra round:
        `RunConfig.check` allows one)."""
        for m in self.active:
            if isinstance(m, ExtraRound):
                first = rounds.first_round(self.ctx.tokenizer, batch.records, batch.rollout)
                return first, m.extend(batch, first, key)
        return None

    def answer(self, params: Any) -> Callable[[list[dict], list[str], jax.Array],
                                              np.ndarray] | None:
        """Evaluation's `second` (`evaluation.evaluate`) of the policy `params`, or None."""
        for m in self.active:
            if isinstance(m, Answerer):
                return functools.partial(m.answer, params)
        return None
