"""The `prefix_credit` probe (issue #47): do correct peers already pay for a wrong response's
right prefix?

Every IBPO form ends level with its base optimizer on both embedded tasks. The reading tested:
a wrong response's right prefix is mostly a prefix its correct peers share; on a shared
(context, token) their positive advantages and its negative one meet on the same logit (DESIGN
§5), so GSPO's uniform penalty on a right prefix is already cancelled and φ has little left to
fix; IBPO should then matter on right steps that no correct peer took.

Nothing is trained. Batches: `BATCHES` rollout batches per seed of the committed base (the
run's sampler, prompts and G: the batches of `credit_probe`), and as many held-out batches
(evaluation prompts) sampled by the final GSPO and IBPO-GSPO policies of the lowest run seeds
whose final checkpoints exist under the runs dir. On each:
- every token's node in its group's prefix trie (`cancellation.prefix_nodes`), how many right
  and wrong responses pass through it, and, for a wrong response, whether the token lies
  before its first error: the checker's first wrong step refined to its first wrong token,
  the token from which the response can no longer be extended to a right one (on `arith` a
  prefix of the unique right answer; on `countdown` lines the checker accepts, the last one
  possibly partial: `prefix_rules`, the probe's one task-specific part), so that "right so
  far" is a property of the node. The checker's line must contain that token
  (`checker_mismatch` counts exceptions); shares at the step level are reported beside.
  Distinct right answers per mixed group: token sequences on `arith`, solutions on
  `countdown` (`countdown.solution_key`; distinct texts beside).
- each node's net update weight Σ_{members} A_it w_it under GSPO, IBPO-GSPO (sequence credit)
  and IBPO-GSPO with token credit, from the same trajectories: A from each run's own `credit`,
  w from its loss (`losses.token_weights`: 1/|y_i| with seq_mean_token_mean) at ratio 1, as
  the step's first minibatch update applies it (the later ones see the ratios their
  predecessors moved, where GSPO's tight clip can zero a whole response's w: not modelled);
  the KL term carries no advantage and is left out. In advantage units: × the batch's mean
  response length, so a node that one response passes alone carries about that response's A.
Node classes, over the groups with right and wrong responses (elsewhere every A is 0):
(a) `shared`: right-prefix node of a wrong response that a correct response passes too;
(b) `unshared`: right-prefix node no correct response passes; (c) `post_error`: past a wrong
member's first error; (d) `correct_only`.
Records: experiments/results/runs/<task>/prefix_credit_s<seed>.json (the trained part is added
once the checkpoints exist); the page is rebuilt from them.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from experiments.host import cpu_model, git_commit
from experiments.probes import base_probe
from experiments.probes.prefix_classes import (  # noqa: F401  (also prefix_credit.*: the probe's terms)
    CLASS_LABELS,
    CLASSES,
    CREDIT_LABELS,
    CREDITS,
    EDGES,
    RUNS,
    SHARE,
)
from experiments.probes.prefix_rules import ARITH, Rule, rule_for, truth
from experiments.reports import prefix_credit_report
from ibpo_jax import config
from ibpo_jax.core import cancellation, losses
from ibpo_jax.runtime import sharding
from ibpo_jax.trainer import batching, loop, step
from ibpo_jax.trainer.checkpoint import Checkpointer

ROOT = Path(__file__).resolve().parents[2]
BATCHES = 8  # rollout batches per seed and part (arith: 8 x 32 prompts x G 8 = 2,048 responses)
TOL = 1e-4  # |net| at most this (advantage units) is 0: float32 sums of O(1) terms
HELD_OUT = 1 << 20  # key offset of held-out batches (apart from the rollout keys 0, 1, ...)


class NodeTable(NamedTuple):
    """One group's prefix-trie nodes, indexed by (member i, position t); [G, T] unless said."""

    rep: jax.Array  # bool: i is the node's lowest-index member (count each node once)
    members: jax.Array  # int32: responses through the node (0 on padding)
    right_members: jax.Array  # int32: correct responses through the node
    cls: jax.Array  # int32: index into CLASSES, -1 on padding
    net: jax.Array  # [K, G, T] float32: Σ_{members j} A_jt w_jt under each of K credits


def node_table(tokens: jax.Array, mask: jax.Array, correct: jax.Array, right: jax.Array,
               adv: jax.Array, weights: jax.Array) -> NodeTable:
    """Members, class and net update weight of every node of one group (module docstring).

    tokens, mask: [G, T] (left-aligned responses); correct: [G] bool; right: [G, T] bool, the
    token lies before its response's first error (ignored for correct responses); adv: [K, G]
    or [K, G, T] advantages and weights: [K, G, T] the loss's w of K credits."""
    nodes = cancellation.prefix_nodes(tokens, mask)
    valid = jnp.asarray(mask).astype(bool)
    wrong = ~jnp.asarray(correct)[:, None] & valid
    right = jnp.asarray(right).astype(bool)
    count = lambda x: cancellation.node_sum(nodes.share, x.astype(jnp.float32))  # noqa: E731
    n_right, before, after = count(valid & ~wrong), count(wrong & right), count(wrong & ~right)
    cls = jnp.where(after > 0, 2, jnp.where(before > 0, jnp.where(n_right > 0, 0, 1), 3))
    weights = jnp.asarray(weights, jnp.float32)
    adv = jnp.asarray(adv, jnp.float32)
    adv = jnp.broadcast_to(adv[..., None] if adv.ndim == 2 else adv, weights.shape)
    net = jax.vmap(lambda aw: cancellation.node_sum(nodes.share, aw))(
        jnp.where(valid, adv * weights, 0.0))
    return NodeTable(nodes.rep, nodes.count, n_right.astype(jnp.int32),
                     jnp.where(valid, cls, -1).astype(jnp.int32), net)


@functools.partial(jax.jit, static_argnames="g")
def _tables(tokens, mask, correct, right, adv, weights, *, g: int) -> NodeTable:
    """`node_table` of every group: [N, ...] rows (adv, weights [K, N, T]) -> [B, ...]."""
    grp = lambda x: x.reshape(x.shape[0] // g, g, *x.shape[1:])  # noqa: E731
    kgrp = lambda x: jnp.moveaxis(x.reshape(x.shape[0], -1, g, x.shape[-1]), 0, 1)  # noqa: E731
    return jax.vmap(node_table)(grp(tokens), grp(mask), grp(correct), grp(right), kgrp(adv),
                                kgrp(weights))


class Credits(NamedTuple):
    fns: dict  # credit name -> jitted step.credit of its run's spec
    losses: dict  # credit name -> its loss spec (for w)


def credits(trainer: loop.Trainer, load: Callable[..., config.RunConfig]) -> Credits:
    fns, specs = {}, {}
    for name, (algo, more) in CREDITS.items():
        spec = step.StepSpec.from_config(load(algo, more), trainer.parts.base.config,
                                         trainer.parts.base.options)
        fns[name], specs[name] = jax.jit(functools.partial(step.credit, spec)), spec.loss
    return Credits(fns, specs)


def _adv_weights(trainer: loop.Trainer, cr: Credits, rollout) -> tuple[np.ndarray, np.ndarray]:
    """([K, N, R] advantages, [K, N, R] w at ratio 1) of the credits on one rollout."""
    n, r = rollout.response.shape
    mask = np.arange(r)[None, :] < sharding.host_array(rollout.response_len)[:, None]
    zeros, advs, ws = np.zeros((n, r), np.float32), [], []
    for name, fn in cr.fns.items():
        with jax.set_mesh(trainer.parts.mesh):
            adv = sharding.host_array(fn(rollout, trainer.parts.is_delim)[0].adv)
        ws.append(np.asarray(losses.token_weights(cr.losses[name], logp=zeros, old_logp=zeros,
                                                  adv=adv, mask=mask)))
        advs.append(np.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, (n, r)))
    return np.stack(advs), np.stack(ws)


def distinct_correct(tokens: np.ndarray, lengths: np.ndarray, ok: np.ndarray,
                     mixed: np.ndarray, key: Callable = tuple) -> int:
    """Σ over the mixed groups of how many distinct right answers each has (`key` of a row's
    token list; default: the token sequence): one per group when the right path is unique."""
    g = ok.shape[1]
    return sum(len({key(tokens[b * g + i, :lengths[b * g + i]].tolist()) for i in range(g)
                    if ok[b, i]}) for b in np.nonzero(mixed)[0])


class Part:
    """Accumulates one part's nodes (mixed groups only) and token counts over its batches."""

    def __init__(self, rule: Rule = ARITH):
        self.rule = rule  # the task's right prefix and solutions (prefix_rules)
        self.nodes: dict[str, list[np.ndarray]] = {"cls": [], "members": [], "right": [],
                                                   "whole": [], "net": []}
        self.n = dict.fromkeys(("batches", "groups", "mixed_groups", "responses", "correct",
                                "wrong_scored", "right_tokens", "right_shared",
                                "right_shared_all", "right_tokens_step", "right_shared_step",
                                "post_error_tokens", "wrong_with_unshared", "distinct_correct",
                                "checker_mismatch", "off_reference", "no_right_groups",
                                "right_tokens_no_right", "distinct_correct_text"), 0)

    def add(self, trainer: loop.Trainer, cr: Credits, batch: tuple) -> None:
        rollout, records, tokens, lengths, correct, infos = batch
        g, (n, r) = trainer.parts.cfg.rollout.group_size, tokens.shape
        t = truth(trainer.parts.tokenizer, records, tokens, lengths, correct, infos, self.rule)
        adv, w = _adv_weights(trainer, cr, rollout)
        mask = np.arange(r)[None, :] < lengths[:, None]
        tab = jax.device_get(_tables(tokens, mask, correct, t.right, adv, w, g=g))
        ok = correct.reshape(-1, g)
        mixed = ok.any(1) & ~ok.all(1)
        sel = tab.rep & mixed[:, None, None] & (tab.cls >= 0)
        self.nodes["cls"].append(tab.cls[sel])
        self.nodes["members"].append(tab.members[sel])
        self.nodes["right"].append(tab.right_members[sel])
        self.nodes["whole"].append(tab.members[sel] == g)  # every response of the group
        self.nodes["net"].append(np.moveaxis(tab.net, 1, 0)[:, sel] * lengths.mean())
        wrong = (~ok & mixed[:, None]).reshape(-1)[:, None] & mask
        n_right = tab.right_members.reshape(n, r)
        all_right = np.repeat(ok.sum(1), g)[:, None]
        unshared = wrong & t.right & (n_right == 0)
        none = np.repeat(~ok.any(1), g)[:, None] & mask  # groups with no right response
        for key, val in (("batches", 1), ("groups", n // g), ("mixed_groups", mixed.sum()),
                         ("responses", n), ("correct", correct.sum()),
                         ("wrong_scored", wrong.any(1).sum()),
                         ("right_tokens", (wrong & t.right).sum()),
                         ("right_shared", (wrong & t.right & (n_right > 0)).sum()),
                         ("right_shared_all", (wrong & t.right & (n_right == all_right)).sum()),
                         ("right_tokens_step", (wrong & t.right_step).sum()),
                         ("right_shared_step", (wrong & t.right_step & (n_right > 0)).sum()),
                         ("post_error_tokens", (wrong & ~t.right).sum()),
                         ("wrong_with_unshared", unshared.any(1).sum()),
                         ("distinct_correct", distinct_correct(
                             tokens, lengths, ok, mixed,
                             functools.partial(self.rule.solution, trainer.parts.tokenizer))),
                         ("distinct_correct_text", distinct_correct(tokens, lengths, ok, mixed)),
                         ("checker_mismatch", t.mismatch), ("off_reference", t.off_reference),
                         ("no_right_groups", (~ok.any(1)).sum()),
                         ("right_tokens_no_right", (none & t.right).sum())):
            self.n[key] += int(val)

    def summary(self) -> dict:
        nodes = {k: np.concatenate(v, axis=-1) for k, v in self.nodes.items()}
        return {"counts": self.n, **summarize(nodes["cls"], nodes["members"], nodes["right"],
                                              nodes["whole"], nodes["net"])}


def _dist(x: np.ndarray) -> dict:
    if not len(x):
        return {"n": 0}
    q = np.quantile(x, [0.05, 0.25, 0.5, 0.75, 0.95])
    return {"n": len(x), "ge0": float(np.mean(x >= -TOL)), "pos": float(np.mean(x > TOL)),
            "zero": float(np.mean(np.abs(x) <= TOL)), "mean": float(x.mean()),
            "abs_mean": float(np.abs(x).mean()), "q": [float(v) for v in q]}


def concentration(change: np.ndarray, members: np.ndarray, share: float = SHARE) -> dict:
    """The fewest nodes carrying `share` of Σ|change|: their share of the nodes and of the
    response tokens (members) on them."""
    total = change.sum()
    if not len(change) or total <= 0:
        return {"nodes": 0.0, "tokens": 0.0}
    order = np.argsort(-change, kind="stable")
    k = int(np.searchsorted(np.cumsum(change[order]), share * total)) + 1
    return {"nodes": k / len(change),
            "tokens": float(members[order[:k]].sum() / max(members.sum(), 1))}


def summarize(cls: np.ndarray, members: np.ndarray, right: np.ndarray, whole: np.ndarray,
              net: np.ndarray) -> dict:
    """Per class: node counts, the net weight's distribution under each credit (and GSPO's off
    the nodes the whole group shares, where Σ A = 0 leaves only unequal weights) and IBPO's
    change against GSPO; IBPO's concentration. cls, members, right (correct members), whole
    (bool): [M] nodes; net: [K, M] in CREDITS order, GSPO first."""
    out: dict = {"classes": {}, "concentration": {}, "hist": {}}
    change = {name: net[k] - net[0] for k, name in enumerate(CREDITS) if k}
    total = {name: float(np.abs(d).sum()) for name, d in change.items()}
    for c, name in enumerate(CLASSES):
        m = cls == c
        entry = {"nodes": int(m.sum()), "members": float(members[m].mean()) if m.any() else 0.0,
                 "right_members": float(right[m].mean()) if m.any() else 0.0,
                 "whole": float(whole[m].mean()) if m.any() else 0.0,
                 "gspo_partial": _dist(net[0][m & ~whole])}
        base = np.abs(net[0][m]).sum()
        for k, cred in enumerate(CREDITS):
            entry[cred] = _dist(net[k][m])
            if k:
                d = change[cred][m]
                entry[f"change_{cred}"] = {
                    "rel": float(np.abs(d).sum() / base) if base > 0 else 0.0,
                    "share": float(np.abs(d).sum() / total[cred]) if total[cred] > 0 else 0.0,
                    "mean": float(d.mean()) if m.any() else 0.0}
        out["classes"][name] = entry
        out["hist"][name] = {cred: np.histogram(np.clip(net[k][m], EDGES[0], EDGES[-1]),
                                                EDGES)[0].tolist() for k, cred in
                             enumerate(CREDITS)}
    for cred, d in change.items():
        out["concentration"][cred] = concentration(np.abs(d), members)
    return out


# ------------------------------------------------------------------------------ sampling


def scored(trainer: loop.Trainer, records: list[dict], prompts, out) -> tuple:
    """One sampled batch as (rollout, per row: record, tokens [N, R], lengths, correct,
    infos), scored as an RL step scores it (one process: every row is here)."""
    g = trainer.parts.cfg.rollout.group_size
    rows, tokens = sharding.local_rows(out.tokens)
    lengths = sharding.host_array(out.lengths)
    if len(rows) != len(lengths):
        raise RuntimeError("prefix_credit runs on one process (each needs every row)")
    recs = [records[i // g] for i in rows]
    reward, correct, ended, infos = trainer.parts.collector.score(recs, tokens, lengths[rows])
    rollout, _ = trainer.parts.collector.as_rollout(prompts, out, rows, reward, correct, ended,
                                                    lengths)
    return rollout, recs, np.asarray(tokens), np.asarray(lengths[rows]), correct, infos


def held_out(trainer: loop.Trainer, k: int) -> tuple:
    """Held-out batch k: the next prompts_per_step evaluation prompts (wrapping around), G
    samples each from the trainer's current policy, as the rollout's sampler draws them."""
    cfg, b = trainer.parts.cfg, trainer.parts.cfg.rollout.prompts_per_step
    pool = trainer.parts.eval_records
    records = [pool[(k * b + i) % len(pool)] for i in range(b)]
    prompts = batching.encode_prompts(
        trainer.parts.tokenizer, [trainer.parts.eval_task.prompt_text(r) for r in records],
        cfg.rollout.max_prompt_len)
    with jax.set_mesh(trainer.parts.mesh):
        key = jax.random.fold_in(trainer.parts.seed_key, HELD_OUT + k)
        out = trainer.parts.generate(trainer.state.params, prompts.tokens, prompts.lengths, key)
    return records, prompts, out


def _loader(preset: str, extra: tuple, seed: int) -> Callable[..., config.RunConfig]:
    return lambda algo, more=(): config.load(f"{ROOT / 'configs' / f'{algo}.py'}:{preset}",
                                             [*extra, ("seed", str(seed)), *more])


def _provenance() -> dict:
    commit, dirty = git_commit(ROOT)  # the code and host that measured it
    return {"commit": commit, "dirty": dirty, "cpu": cpu_model()}


def measure_base(preset: str, extra: tuple, seed: int, batches: int) -> dict:
    """One seed's record: the base policy's part (the rollout batches of `credit_probe`)."""
    load = _loader(preset, extra, seed)
    with base_probe.base_trainer(load("gspo")) as (trainer, base):
        reward = trainer.parts.task.reward  # names the task's rule (prefix_rules.RULES)
        part, cr = Part(rule_for(reward)), credits(trainer, load)
        for k in range(batches):
            with jax.set_mesh(trainer.parts.mesh):  # placed like the trainer's own keys
                key = jax.random.fold_in(trainer.parts.seed_key, k)
            got = trainer.parts.collector.sample(key, trainer.policy)
            part.add(trainer, cr, scored(trainer, *got))
    return {"preset": preset, "overrides": [*extra, ("seed", str(seed))], "seed": seed,
            "base": base, "batches": batches, "rule": reward, "base_policy": part.summary(),
            **_provenance()}


def final_seeds(runs_dir: Path, steps: int) -> list[int]:
    """Run seeds (ascending) whose GSPO and IBPO-GSPO workdirs under `runs_dir` both hold the
    final checkpoint, step `steps` (orbax names a step's directory only once it is complete)."""
    seeds = sorted(int(p.name.rpartition("_s")[2]) for p in runs_dir.glob("gspo_s*")
                   if p.name.rpartition("_s")[2].isdigit())
    return [s for s in seeds if all((runs_dir / f"{algo}_s{s}" / "checkpoints" / str(steps))
                                    .is_dir() for algo in RUNS.values())]


def _restore(trainer: loop.Trainer, workdir: Path, step_: int, algo: str, seed: int) -> None:
    """The trainer's state <- the checkpoint `step_` of run `workdir` (checked to be `algo`'s
    run of `seed`)."""
    ckpt = Checkpointer(workdir / "checkpoints", read_only=True)
    try:
        state, meta = ckpt.restore(step_, trainer.state)
    finally:
        ckpt.close()
    got = meta.get("config", {})
    if (got.get("algo"), got.get("seed")) != (algo, seed):
        raise ValueError(f"{workdir}: checkpoint {step_} holds algo {got.get('algo')!r} seed "
                         f"{got.get('seed')!r}, not {algo!r} seed {seed}")
    trainer.state = state


def measure_trained(preset: str, extra: tuple, seed: int, batches: int, runs_dir: Path,
                    run_seed: int) -> dict:
    """Held-out batches of the final GSPO and IBPO-GSPO policies of run seed `run_seed` (the
    probe's seed draws the prompts' order and keys)."""
    load = _loader(preset, extra, seed)
    steps = load("gspo").train.steps
    out = {"runs_dir": str(runs_dir), "run_seed": run_seed, "step": steps, "batches": batches,
           **_provenance()}
    with base_probe.base_trainer(load("gspo")) as (trainer, _):
        cr = credits(trainer, load)
        for label, algo in RUNS.items():
            workdir = runs_dir / f"{algo}_s{run_seed}"
            _restore(trainer, workdir, steps, algo, run_seed)
            part = Part(rule_for(trainer.parts.task.reward))
            for k in range(batches):
                part.add(trainer, cr, scored(trainer, *held_out(trainer, k)))
            base = workdir / "base.json"
            out[label] = {"run_base": json.loads(base.read_text()) if base.exists() else None,
                          **part.summary()}
    return out


def ensure(*, preset: str, extra: tuple, seeds: int, records_dir: Path, runs_dir: Path,
           batches: int = BATCHES, probe: bool = True, log=print) -> list[dict]:
    """The records of seeds 0..seeds-1: the base part measured where missing, the trained part
    (record s: the s-th lowest run seed with final checkpoints) where missing or another run
    seed's (unless not `probe`)."""
    recs = base_probe.seed_records(records_dir, "prefix_credit", seeds,
                                   lambda s: measure_base(preset, extra, s, batches), probe=probe)
    steps = _loader(preset, extra, 0)("gspo").train.steps
    run_seeds = final_seeds(runs_dir, steps) if runs_dir.is_dir() else []
    log(f"prefix_credit: final checkpoints (step {steps}) under {runs_dir} for run seeds "
        f"{run_seeds or 'none'}")
    for rec in recs:
        s = rec["seed"]
        if not probe or s >= len(run_seeds) or (rec.get("trained") or {}).get(
                "run_seed") == run_seeds[s]:
            continue
        rec["trained"] = measure_trained(preset, extra, s, batches, runs_dir, run_seeds[s])
        path = records_dir / f"prefix_credit_s{s}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec) + "\n")
        os.replace(tmp, path)
    return recs


# ------------------------------------------------------------------------------ entry


def reproduce(*, preset: str, extra: tuple, seeds: int, records_dir: Path, out_dir: Path,
              runs_dir: Path, command: str, batches: int = BATCHES, probe: bool = True
              ) -> list[Path]:
    """Measures what the records lack (unless not `probe`), then writes prefix_credit.md /
    .json / .png from the records (nothing when there are none)."""
    recs = ensure(preset=preset, extra=extra, seeds=seeds, records_dir=records_dir,
                  runs_dir=runs_dir, batches=batches, probe=probe)
    if not recs:
        return []
    return prefix_credit_report.write(recs, out_dir=out_dir, command=command,
                                      records_dir=records_dir)


def probe(ctx) -> list[Path]:
    """The `probe` hook of the `prefix_credit` item (`items.ProbeContext`; --smoke: 1 batch)."""
    return reproduce(preset=ctx.preset, extra=ctx.extra, seeds=ctx.seeds,
                     records_dir=ctx.records_dir, out_dir=ctx.out_dir, runs_dir=ctx.runs_dir,
                     command=ctx.command, batches=1 if ctx.smoke else BATCHES,
                     probe=ctx.measure)


def main(argv: list[str] | None = None) -> int:
    from experiments import reproduce as reproduce_lib  # its TASKS: --task -> preset

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=tuple(reproduce_lib.TASKS), default="arith")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--runs-dir", type=Path, default=None,
                   help="GSPO / IBPO-GSPO run workdirs (default: runs/reproduce/<task>)")
    p.add_argument("--batches", type=int, default=BATCHES)
    p.add_argument("--out", type=Path, default=reproduce_lib.RESULTS,
                   help="results directory (records under <out>/runs/<task>/)")
    p.add_argument("--report-only", action="store_true", help="measure nothing")
    args = p.parse_args(argv)
    preset, extra = reproduce_lib.TASKS[args.task]
    runs_dir = args.runs_dir or ROOT / "runs" / "reproduce" / args.task
    command = f"python -m experiments.probes.prefix_credit --task {args.task} --seeds {args.seeds}"
    for path in reproduce(preset=preset, extra=extra, seeds=args.seeds,
                          records_dir=args.out / "runs" / args.task,
                          out_dir=args.out / args.task, runs_dir=runs_dir, command=command,
                          batches=args.batches, probe=not args.report_only):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
