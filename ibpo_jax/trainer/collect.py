"""Collect, the RL step's first box: the next prompts, G samples of each, scored by the
verifier, as the update's `Rollout` on the mesh with its packing plan.

`Collector` is what collecting needs of a run, built once by the trainer and never changed
after; `Collector.collect` is a function of the step key, the params and the data position
alone, so the off-policy schedule (trainer/offpolicy.py) may run it in a thread of its own.
Its strategies: dynamic sampling's rounds and overlong shaping (trainer/dynamic.py), the step
labels the run's operator reads (trainer/step_labels.py; the policy's continuations for
"vouched_steps": trainer/vouch.py).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh

from ibpo_jax.config import RunConfig
from ibpo_jax.data.sampler import IndexSampler
from ibpo_jax.data.tasks import Task
from ibpo_jax.runtime import sharding
from ibpo_jax.sampler import sampling
from ibpo_jax.trainer import batching, dynamic, packing, step
from ibpo_jax.trainer import step_labels as labels_lib
from ibpo_jax.trainer import vouch as vouch_lib
from ibpo_jax.trainer.batching import PromptBatch

# (params, prompts, key) -> samples on the training mesh (`offpolicy.Rollouts.generate`)
Generate = Callable[[Any, PromptBatch, jax.Array], sampling.SampleOutput]


class Collected(NamedTuple):
    """One step's sampled and scored batch: its prompt records and their encoding, the rows
    this process scored with the verifier's reports, every row's response length, the
    `Rollout` on the mesh with its packing plan, the phases' wall times and cost."""

    records: list[dict]
    prompts: PromptBatch
    rows: np.ndarray  # [n] rollout rows this process scored
    infos: list[dict]  # their verifier reports
    lengths: np.ndarray  # [N] every row's response length
    rollout: step.Rollout
    plan: packing.Packing
    times: dict[str, float]  # time_rollout_s, time_reward_s
    sampled: int  # trajectories sampled for it: charged to the budget when a step learns it
    stats: dict[str, float] = {}  # dynamic sampling's and overlong shaping's metrics


@dataclasses.dataclass(frozen=True)
class Collector:
    """The run's parts that collecting reads (`dynamic.RoundSource`)."""

    cfg: RunConfig
    mesh: Mesh  # the training mesh: where the Rollout lives
    task: Task
    tokenizer: Any  # data.tokenizer: HF or CharTokenizer
    records: Sequence[dict]  # the training split
    order: IndexSampler  # the data position (stateful; checkpointed by the trainer)
    generate: Generate
    pool: Any  # the verifier: rewards.RewardPool (off-policy: offpolicy.Serialized around one)
    packer: packing.Packer
    flight: Any = None  # rollout.partial: the prompts in flight (trainer/partial.py) sample
    vouch: vouch_lib.Vouch | None = None  # ibpo.operator "vouched_steps": its continuations

    def collect(self, key: jax.Array, params: Any) -> Collected:
        """The step's batch: the next prompts, G samples of each under `params` and `key`,
        scored (dynamic sampling's rounds, overlong shaping), as the update's `Rollout` on the
        mesh with its packing plan. Its trajectories are charged to the budget when a step
        learns it."""
        got, stats = dynamic.collect_rounds(self, key, params)
        reward = dynamic.shaped_reward(self.cfg, got, stats)
        rollout, plan = self.as_rollout(got.prompts, got.out, got.rows, reward, got.correct,
                                        got.ended, got.lengths, valid=got.valid)
        rollout = labels_lib.label(rollout, got, ibpo=self.cfg.ibpo, task=self.task,
                                   tokenizer=self.tokenizer, mesh=self.mesh)
        sampled, times = got.sampled, got.times
        if self.vouch is not None:
            t0 = time.perf_counter()
            rollout, cost, more = vouch_lib.label(
                self.vouch, rollout, records=got.records, params=params, key=key,
                score=functools.partial(batching.score_all_rows, self.pool, self.tokenizer),
                mesh=self.mesh)
            sampled, stats = sampled + cost, {**stats, **more}
            times = {**times, "time_vouch_s": time.perf_counter() - t0}
        return Collected(got.records, got.prompts, got.rows, got.infos, got.lengths, rollout,
                         plan, times, sampled, stats)

    def sample(self, key: jax.Array, params: Any
               ) -> tuple[list[dict], PromptBatch, sampling.SampleOutput]:
        """The next prompts of the training split, encoded, and G samples of each (with
        rollout.partial, the B oldest finished groups of the prompts in flight)."""
        if self.flight is not None:
            return self.flight.sample(self, key, params)
        cfg = self.cfg.rollout
        records = [self.records[int(i)] for i in self.order.next_indices(cfg.prompts_per_step)]
        prompts = batching.encode_prompts(
            self.tokenizer, [self.task.prompt_text(r) for r in records], cfg.max_prompt_len)
        # On the rollout mesh, in rollout.sample_chunk calls, back on the training mesh.
        return records, prompts, self.generate(params, prompts, key)

    def score(self, records: list[dict], tokens: np.ndarray, lengths: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        """Rewards, correctness, ended-with-EOS and the verifier's reports of this process's
        rollout rows (tokens [n, R], lengths [n])."""
        return batching.score_rows(self.pool, self.tokenizer, records, tokens, lengths)

    def as_rollout(self, prompts: PromptBatch, out: sampling.SampleOutput, rows: np.ndarray,
                   reward: np.ndarray, correct: np.ndarray, ended: np.ndarray,
                   lengths: np.ndarray, valid: np.ndarray | None = None
                   ) -> tuple[step.Rollout, packing.Packing]:
        """The sampled batch as the update's `Rollout` on the mesh (the host's scores placed at
        its rows `rows`; `valid` [N], every row's), and its packing plan."""
        g, n = self.cfg.rollout.group_size, len(lengths)
        place = lambda x: sharding.global_array(x, sharding.batch_sharding(self.mesh, np.ndim(x)))
        mine = lambda x: sharding.rows_array(x, rows, n,
                                             sharding.batch_sharding(self.mesh, np.ndim(x)))
        prompt_len = np.repeat(prompts.lengths, g)
        plan = self.packer.plan(prompt_len, lengths, prompts.tokens.shape[1],
                                out.tokens.shape[1])
        rollout = step.Rollout(
            prompt=place(np.repeat(prompts.tokens, g, axis=0)),
            prompt_len=place(prompt_len),
            response=out.tokens, response_len=out.lengths, sample_logp=out.logprobs,  # on device
            reward=mine(reward.astype(np.float32)), correct=mine(correct), ended=mine(ended),
            valid=None if valid is None else place(valid))
        return rollout, plan
