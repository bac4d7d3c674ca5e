"""PRM+GSPO's process reward in the RL loop (DESIGN §7; the model itself is `ibpo_jax.prm`).

Before RL the base policy samples `prm.samples` responses to each of `prm.num_prompts`
training problems; each step prefix gets a Monte-Carlo label from `prm.completions` rollouts
(`trainer.prm_labels`, charged to budget_trajectories); a scalar head on the frozen base's
features is fitted to them. The head, its cost and its fit metrics are written atomically to
<workdir>/prm/ so a resumed run reuses them. Each RL step then adds λ_prm · min_k PRM_k to the
rewards before the credit: r̃ = R + λ_prm · min_k PRM_k, GSPO on r̃.

Logged: the fit (`prm_fit_*`, at step 0), and per step the mean process reward and, on tasks
whose checker reports the first wrong step (arith), how often the PRM's step scores agree with
it (`prm_label_accuracy`; the Monte-Carlo labels' own agreement is `prm_mc_label_accuracy`).
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

import jax
import numpy as np

from ibpo_jax import prm, sampling, sharding
from ibpo_jax.trainer import prm_labels
from ibpo_jax.trainer.batching import encode_prompts
from ibpo_jax.trainer.credit import Rollout


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


class PrmReward:
    """The fitted PRM of one run: `shape` adds its process reward to a rollout's rewards."""

    def __init__(self, trainer: Any):
        self.cfg, self.trainer = trainer.cfg.prm, trainer
        self.dir = trainer.workdir / "prm"
        base = trainer.base
        self.scores = jax.jit(functools.partial(prm.step_probs, base.config, base.options,
                                                max_steps=self.cfg.max_steps))
        self.head: dict | None = None

    def fit_or_load(self) -> tuple[float, dict[str, float]]:
        """(cost in trajectories, fit metrics): from <workdir>/prm/ if a run saved them."""
        if (self.dir / "prm.json").exists():
            meta = json.loads((self.dir / "prm.json").read_text())
            with np.load(self.dir / "head.npz") as f:
                self.head = {k: jax.numpy.asarray(f[k]) for k in f.files}
            return meta["cost"], meta["metrics"]
        head, cost, metrics = self._fit()  # the same on every process (same seed)
        self.head = head
        if self.trainer.is_main:
            self._save(head, cost, metrics)
        return cost, metrics

    def _save(self, head: dict, cost: float, metrics: dict) -> None:
        tmp = self.dir.with_name(f"prm.tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        np.savez(tmp / "head.npz", **{k: np.asarray(v) for k, v in head.items()})
        (tmp / "prm.json").write_text(json.dumps({"cost": cost, "metrics": metrics}))
        os.replace(tmp, self.dir)  # atomic: a killed fit leaves no half-written PRM

    def _sample(self, records: list[dict], key: jax.Array):
        t, cfg, tok = self.trainer, self.trainer.cfg, self.trainer.tokenizer
        prompts = encode_prompts(tok, [t.task.prompt_text(r) for r in records],
                                 cfg.rollout.max_prompt_len)
        generate = sampling.generate_fn(
            t.base.config, t.base.options, max_new_tokens=cfg.rollout.max_new_tokens,
            temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k, eos_ids=tuple(tok.eos_ids), pad_id=tok.pad_id,
            num_samples=self.cfg.samples, mesh=t.mesh)
        with jax.set_mesh(t.mesh):
            out = generate(t.base.params, prompts.tokens, prompts.lengths, key)
        s = self.cfg.samples
        return (np.repeat(prompts.tokens, s, 0), np.repeat(prompts.lengths, s),
                *(sharding.host_array(x) for x in (out.tokens, out.lengths)))

    def _fit(self) -> tuple[dict, float, dict[str, float]]:
        t, c = self.trainer, self.cfg
        key = jax.random.fold_in(jax.random.key(t.cfg.seed), 0x9A3)
        pick = np.random.default_rng([t.cfg.seed, 0x9A3]).choice(
            len(t.train_records), min(c.num_prompts, len(t.train_records)), replace=False)
        records = [t.train_records[int(i)] for i in np.sort(pick)]
        prompt, prompt_len, response, response_len = self._sample(records, key)
        owner = lambda rows: [records[int(r) // c.samples] for r in rows]  # noqa: E731

        def judge(rows, tokens, lengths):
            return t.score_all(owner(rows), tokens, lengths)[1]  # each process a share

        width = t.cfg.rollout.max_prompt_len + t.cfg.rollout.max_new_tokens
        complete = sampling.generate_fn(
            t.base.config, t.base.options, max_new_tokens=t.cfg.rollout.max_new_tokens,
            temperature=t.cfg.rollout.temperature, eos_ids=tuple(t.tokenizer.eos_ids),
            pad_id=t.tokenizer.pad_id, num_samples=c.completions, mesh=t.mesh)
        with jax.set_mesh(t.mesh):
            mc = prm_labels.monte_carlo_labels(
                generate=complete, params=t.base.params, prompt=prompt, prompt_len=prompt_len,
                response=response, response_len=response_len, is_delim=t.tokenizer.is_delim,
                judge=judge, num_completions=c.completions, max_steps=c.max_steps,
                max_prompt_len=width, pad_id=t.tokenizer.pad_id, key=jax.random.fold_in(key, 1))
            feats = jax.jit(prm.features, static_argnums=(0, 1))(
                t.base.config, t.base.options, t.base.params, prompt, prompt_len, response,
                response_len, mc.pos)
        head, fit = prm.fit_head(jax.random.fold_in(key, 2), feats, mc.labels, mc.valid,
                                 steps=c.head_steps, lr=c.head_lr, width=c.head_width)
        metrics = {f"prm_fit_{k}": v for k, v in fit.items()}
        metrics["prm_label_cost"] = float(mc.cost)
        metrics["prm_prefixes_dropped"] = float(mc.dropped)
        mine = sharding.process_share(len(response))  # each process checks a share
        truth = _truth(t.score(owner(mine), response[mine], response_len[mine])[3])
        if truth is not None:  # the checker knows the first wrong step: grade labels and head
            truth = sharding.gather_shares(truth, len(response))
            metrics["prm_mc_label_accuracy"] = prm.label_accuracy(mc.labels, mc.valid, truth)
            prob = jax.nn.sigmoid(prm.head_apply(head, feats))
            metrics["prm_fit_label_accuracy"] = prm.label_accuracy(prob, mc.valid, truth)
        return head, float(mc.cost), metrics

    def shape(self, rollout: Rollout, rows: np.ndarray, infos: list[dict]
              ) -> tuple[Rollout, dict[str, float]]:
        """The rollout with rewards R + λ_prm · min_k PRM_k, and the step's PRM metrics
        (rows, infos: the rows this process scored and the checker's reports)."""
        with jax.set_mesh(self.trainer.mesh):
            prob, valid = self.scores(self.trainer.base.params, self.head, rollout.prompt,
                                      rollout.prompt_len, rollout.response,
                                      rollout.response_len, self.trainer.is_delim)
            lowest = prm.min_over_steps(prob, valid)
            reward = rollout.reward + self.cfg.weight * lowest
        metrics = {"prm_mean": float(jax.numpy.mean(lowest))}
        truth = _truth(infos)
        if truth is not None:  # the task's checker reports first wrong steps (`arith`)
            prob, valid = (sharding.host_array(x)[rows] for x in (prob, valid))
            # Counts over this process's rows, summed over processes.
            hits, n = sharding.process_sum(np.array(prm.label_agreement(prob, valid, truth)))
            metrics["prm_label_accuracy"] = float(hits / n) if n else float("nan")
        return rollout._replace(reward=reward), metrics


def maybe(trainer: Any) -> PrmReward | None:
    return PrmReward(trainer) if trainer.cfg.prm.weight > 0 else None

