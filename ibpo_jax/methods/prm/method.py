"""PRM+GSPO's process reward in the RL step (DESIGN §7; the model itself is `model`).

Before RL (`prepare`) the base policy samples `prm.samples` responses to each of
`prm.num_prompts` training problems; each step prefix gets a Monte-Carlo label from
`prm.completions` rollouts (`labels`, charged to budget_trajectories); a scalar head on the
frozen base's features is fitted to them. The head, its cost and its fit metrics are written
atomically to <workdir>/prm/ so a resumed run reuses them. Each RL step then adds
λ_prm · min_k PRM_k to the rewards before the credit (`shape`): r̃ = R + λ_prm · min_k PRM_k,
GSPO on r̃.

Logged: the fit (`prm_fit_*`, at step 0), and per step the mean process reward and, on tasks
whose checker reports the first wrong step (arith), how often the PRM's step scores agree with
it (`prm_label_accuracy`; the Monte-Carlo labels' own agreement is `prm_mc_label_accuracy`),
both over the batch's valid rows (dynamic sampling's fillers left out).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ibpo_jax.config.registry import METHODS
from ibpo_jax.methods.prm import labels
from ibpo_jax.methods.prm import model as prm
from ibpo_jax.runtime import sharding
from ibpo_jax.sampler import sampling
from ibpo_jax.trainer import credit as credit_lib
from ibpo_jax.trainer.batching import encode_prompts
from ibpo_jax.trainer.hooks import Context, Method, Scored

FIT_SEED = 0x9A3  # the fit's draws: a stream of its own, the same for every RL step count


def _truth(infos: list[dict]) -> np.ndarray | None:
    """The checker's first wrong step for each of this process's responses (-1: none), or
    None where the checker does not report it. All processes call it and get the same branch,
    since collectives follow it: a process whose share is empty decides with the others."""
    lacks, holds = sharding.process_max(np.array(
        [any("first_wrong_step" not in i for i in infos), bool(infos)], np.int32))
    if lacks or not holds:
        return None
    return np.array([-1 if i["first_wrong_step"] is None else i["first_wrong_step"]
                     for i in infos], np.int64)  # int also for an empty share


@METHODS.register("prm")
class PrmReward(Method):
    """The fitted PRM of one run (a `Preparer` and a `RewardShaper`)."""

    switch = "config.prm.weight"

    @classmethod
    def enabled(cls, cfg: Any) -> bool:
        return cfg.prm.weight > 0

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.cfg = ctx.cfg.prm
        self.dir = ctx.workdir / "prm"
        self.scores = jax.jit(functools.partial(prm.step_probs, ctx.model, ctx.options,
                                                max_steps=self.cfg.max_steps))
        self.head: dict | None = None

    def prepare(self, fresh: bool, log: Callable[[str], None]
                ) -> tuple[float, dict[str, float]]:
        if fresh:
            log("fitting the process reward model (PRM+GSPO)")
        return self.fit_or_load()

    def fit_or_load(self) -> tuple[float, dict[str, float]]:
        """(cost in trajectories, fit metrics): from <workdir>/prm/ if a run saved them."""
        if (self.dir / "prm.json").exists():
            meta = json.loads((self.dir / "prm.json").read_text())
            with np.load(self.dir / "head.npz") as f:
                self.head = {k: jax.numpy.asarray(f[k]) for k in f.files}
            return meta["cost"], meta["metrics"]
        head, cost, metrics = self._fit()  # the same on every process (same seed)
        self.head = head
        if self.ctx.is_main:
            self._save(head, cost, metrics)
        return cost, metrics

    def _save(self, head: dict, cost: float, metrics: dict) -> None:
        tmp = self.dir.with_name(f"prm.tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        np.savez(tmp / "head.npz", **{k: np.asarray(v) for k, v in head.items()})
        (tmp / "prm.json").write_text(json.dumps({"cost": cost, "metrics": metrics}))
        os.replace(tmp, self.dir)  # atomic: a killed fit leaves no half-written PRM

    def _sample(self, records: list[dict], key: jax.Array):
        """The base's `prm.samples` responses to each record: (prompt, prompt_len, response,
        response_len) on the host, one row per response."""
        ctx, s = self.ctx, self.cfg.samples
        prompts = encode_prompts(ctx.tokenizer, [ctx.task.prompt_text(r) for r in records],
                                 ctx.cfg.rollout.max_prompt_len)
        with jax.set_mesh(ctx.mesh):
            out = ctx.sampler(s)(ctx.base_params, prompts.tokens, prompts.lengths, key)
        return (np.repeat(prompts.tokens, s, 0), np.repeat(prompts.lengths, s),
                *(sharding.host_array(x) for x in (out.tokens, out.lengths)))

    def _labels(self, prompt: np.ndarray, prompt_len: np.ndarray, response: np.ndarray,
                response_len: np.ndarray, judge: labels.Judge, key: jax.Array
                ) -> labels.MCLabels:
        """Monte-Carlo labels of the sampled responses' step prefixes (`labels`)."""
        ctx, c, r = self.ctx, self.cfg, self.ctx.cfg.rollout
        complete = sampling.generate_fn(  # the rollout's temperature, no top-p / top-k
            ctx.model, ctx.options, max_new_tokens=r.max_new_tokens, temperature=r.temperature,
            eos_ids=tuple(ctx.tokenizer.eos_ids), pad_id=ctx.tokenizer.pad_id,
            num_samples=c.completions, mesh=ctx.mesh)
        with jax.set_mesh(ctx.mesh):
            return labels.monte_carlo_labels(
                generate=complete, params=ctx.base_params, prompt=prompt,
                prompt_len=prompt_len, response=response, response_len=response_len,
                is_delim=ctx.tokenizer.is_delim, judge=judge, num_completions=c.completions,
                max_steps=c.max_steps, max_prompt_len=r.max_prompt_len + r.max_new_tokens,
                pad_id=ctx.tokenizer.pad_id, key=key)

    def _fit(self) -> tuple[dict, float, dict[str, float]]:
        ctx, c = self.ctx, self.cfg
        key = jax.random.fold_in(jax.random.key(ctx.cfg.seed), FIT_SEED)
        pick = np.random.default_rng([ctx.cfg.seed, FIT_SEED]).choice(
            len(ctx.train_records), min(c.num_prompts, len(ctx.train_records)), replace=False)
        records = [ctx.train_records[int(i)] for i in np.sort(pick)]
        prompt, prompt_len, response, response_len = self._sample(records, key)
        owner = lambda rows: [records[int(r) // c.samples] for r in rows]  # noqa: E731

        def judge(rows, tokens, lengths):
            return ctx.score_shared(owner(rows), tokens, lengths)[1]  # each process a share

        mc = self._labels(prompt, prompt_len, response, response_len, judge,
                          jax.random.fold_in(key, 1))
        with jax.set_mesh(ctx.mesh):
            feats = jax.jit(prm.features, static_argnums=(0, 1))(
                ctx.model, ctx.options, ctx.base_params, prompt, prompt_len, response,
                response_len, mc.pos)
        head, fit = prm.fit_head(jax.random.fold_in(key, 2), feats, mc.labels, mc.valid,
                                 steps=c.head_steps, lr=c.head_lr, width=c.head_width)
        metrics = {f"prm_fit_{k}": v for k, v in fit.items()}
        metrics["prm_label_cost"] = float(mc.cost)
        metrics["prm_prefixes_dropped"] = float(mc.dropped)
        mine = sharding.process_share(len(response))  # each process checks a share
        truth = _truth(ctx.score_mine(owner(mine), response[mine], response_len[mine])[3])
        if truth is not None:  # the checker knows the first wrong step: grade labels and head
            truth = sharding.gather_shares(truth, len(response))
            metrics["prm_mc_label_accuracy"] = prm.label_accuracy(mc.labels, mc.valid, truth)
            prob = jax.nn.sigmoid(prm.head_apply(head, feats))
            metrics["prm_fit_label_accuracy"] = prm.label_accuracy(prob, mc.valid, truth)
        return head, float(mc.cost), metrics

    def shape(self, batch: Scored) -> tuple[Scored, dict[str, float]]:
        """The batch with rewards R + λ_prm · min_k PRM_k, and the step's PRM metrics."""
        ctx, rollout = self.ctx, batch.rollout
        with jax.set_mesh(ctx.mesh):
            prob, valid = self.scores(ctx.base_params, self.head, rollout.prompt,
                                      rollout.prompt_len, rollout.response,
                                      rollout.response_len, ctx.is_delim)
            lowest = prm.min_over_steps(prob, valid)
            reward = rollout.reward + self.cfg.weight * lowest
        # Over the trained rows: dynamic sampling's fillers (`Rollout.valid`) are left out.
        metrics = {"prm_mean": float(credit_lib.live_mean(lowest, rollout.valid))}
        truth = _truth(batch.infos)
        if truth is not None:  # the task's checker reports first wrong steps (`arith`)
            prob, valid = (sharding.host_array(x)[batch.rows] for x in (prob, valid))
            if rollout.valid is not None:
                valid = valid & sharding.host_array(rollout.valid)[batch.rows][:, None]
            # Counts over this process's rows, summed over processes.
            hits, n = sharding.process_sum(np.array(prm.label_agreement(prob, valid, truth)))
            metrics["prm_label_accuracy"] = float(hits / n) if n else float("nan")
        return dataclasses.replace(batch, rollout=rollout._replace(reward=reward)), metrics
