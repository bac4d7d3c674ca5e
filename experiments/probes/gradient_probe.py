"""Same batches, every IBPO variant: where each one sends the update's gradient (issue 16).

The `variants` item trains each variant and averages its diagnostics over its own run, so two
variants are compared on different batches and different policies. This probe holds both
fixed: the task's warm-started base policy samples `BATCHES` rollout batches per seed (the
run's sampler, prompts and G), and on each batch every IBPO variant of the item computes its
credit and the trainer's own Appendix A diagnostic (`pg_variance.measure`, at the policy that
sampled the batch) beside the same batch's GSPO counterpart:

- `pg_var_ratio`: the variance across groups of the per-group gradient, variant / GSPO;
- `pg_noise_ratio` (and `_gspo`): that variance over the squared norm of the mean gradient;
  a shaping that only rescales the gradient leaves it unchanged;
- `grad_share_before_error` (and `_gspo`): of the gradient that the wrong responses φ scores
  carry, the share flowing through their tokens before the first error;
- `adv_sign_flip_frac`, `adv_mass_before_error`: the credit's own statistics.

Each seed's per-batch values are a record under
experiments/results/runs/<task>/gradient_probe_s<seed>.json; the section it adds to
`variants.md` is rebuilt from those records without sampling again.
"""

from __future__ import annotations

import functools
import statistics
from pathlib import Path

import jax
import numpy as np

from experiments import items as items_lib
from experiments import items_paper
from experiments.host import cpu_model, git_commit
from experiments.probes import base_probe
from ibpo_jax import config
from ibpo_jax.trainer import loop, pg_variance, step

ROOT = items_lib.ROOT
BATCHES = 4  # rollout batches per seed: each costs every variant's diagnostic (~8 s each)
KEYS = ("pg_var_ratio", "pg_noise_ratio", "pg_noise_ratio_gspo", "grad_share_before_error",
        "grad_share_before_error_gspo", "adv_sign_flip_frac", "adv_mass_before_error")


def variants() -> list[items_lib.Run]:
    """The IBPO runs of the `variants` item (its GSPO baselines are each batch's `_gspo`)."""
    return [r for r in items_paper.VARIANT_RUNS if r.algo.startswith("ibpo")]


def _functions(trainer: loop.Trainer, cfg: config.RunConfig):
    spec = step.StepSpec.from_config(cfg, trainer.parts.base.config, trainer.parts.base.options)
    return (jax.jit(functools.partial(step.credit, spec)),
            jax.jit(functools.partial(pg_variance.measure, spec)))


def measure(preset: str, extra: tuple, seed: int, batches: int, n_variants: int = 0) -> dict:
    """One seed's record: per variant label, per key, the value on each batch (the first
    `n_variants` variants only, if > 0)."""
    overrides = [*extra, ("seed", str(seed))]
    load = lambda algo, more=(): config.load(  # noqa: E731
        f"{ROOT / 'configs' / f'{algo}.py'}:{preset}", [*overrides, *more])
    runs = variants()[:n_variants or None]
    values: dict[str, dict[str, list[float]]] = {r.label: {k: [] for k in KEYS} for r in runs}
    with base_probe.base_trainer(load("ibpo_gspo")) as (trainer, base):
        fns = {r.label: _functions(trainer, load(r.algo, r.overrides)) for r in runs}
        g = trainer.parts.cfg.rollout.group_size
        for k in range(batches):
            batch = base_probe.sample_batch(trainer, k)
            prompt_len = np.repeat(batch.prompts.lengths, g)
            plan = trainer.parts.packer.plan(prompt_len, prompt_len,
                                             batch.prompts.tokens.shape[1], 0, whole_groups=True)
            for label, (credit_fn, measure_fn) in fns.items():
                with jax.set_mesh(trainer.parts.mesh):
                    cred, metrics = credit_fn(batch.rollout, trainer.parts.is_delim)
                    diag = measure_fn(trainer.state, trainer.parts.base.params, batch.rollout, cred,
                                      plan, trainer.parts.is_delim)
                got = {k: float(v) for k, v in jax.device_get({**metrics, **diag}).items()}
                for name in KEYS:
                    values[label][name].append(got[name])
    commit, dirty = git_commit(ROOT)  # the code and host that measured it
    return {"preset": preset, "overrides": overrides, "base": base, "batches": batches,
            "values": values, "commit": commit, "dirty": dirty, "cpu": cpu_model()}


def ensure(*, preset: str, extra: tuple, seeds: int, records_dir: Path, batches: int = BATCHES,
           n_variants: int = 0, probe: bool = True) -> list[dict]:
    """The seeds' records, measuring those without one (unless not `probe`)."""
    return base_probe.seed_records(
        records_dir, "gradient_probe", seeds,
        lambda seed: measure(preset, extra, seed, batches, n_variants), probe=probe)


def section_of(ctx: items_lib.ProbeContext) -> list[str]:
    """The `sections` hook of the `variants` item: its probe records (measured when missing,
    unless --report-only; under --smoke 1 batch of 2 variants) as the page's section."""
    # It measures the seeds the command asked for and reads every seed recorded: the page's
    # `seeds` counts the runs' records, and the headline pair's 8 would ask for 8 probes.
    ensure(preset=ctx.preset, extra=ctx.extra, seeds=ctx.asked, records_dir=ctx.records_dir,
           batches=1 if ctx.smoke else BATCHES, n_variants=2 if ctx.smoke else 0,
           probe=ctx.measure)
    recs = ensure(preset=ctx.preset, extra=ctx.extra, seeds=max(ctx.seeds, ctx.asked),
                  records_dir=ctx.records_dir, probe=False)
    return section(recs, command=ctx.command)


def _cell(recs: list[dict], label: str, key: str) -> str:
    """Mean ± sd over seeds of each seed's mean over its batches."""
    per_seed = [statistics.mean(v) for r in recs if (v := r["values"].get(label, {}).get(key))]
    if not per_seed:
        return "—"
    sd = statistics.stdev(per_seed) if len(per_seed) > 1 else float("nan")
    return f"{statistics.mean(per_seed):.3f}" + ("" if sd != sd else f" ± {sd:.3f}")


def section(recs: list[dict], *, command: str) -> list[str]:
    """The Markdown section `variants.md` gains (empty without records)."""
    if not recs:
        return []
    labels = [r.label for r in variants()]
    lines = ["", "## Same batches, at the base policy", "",
             f"Produced by `{command}` (`experiments/probes/gradient_probe.py`, records "
             f"`gradient_probe_s*.json`): {recs[0]['batches']} rollout batch(es) of the base "
             f"policy per seed, {len(recs)} seed(s); on each batch every variant's credit and "
             "diagnostics beside GSPO's on the same batch (`_gspo`). Mean ± sd over seeds of "
             "the per-seed means.", "",
             "| variant | " + " | ".join(KEYS) + " |", "|" + "---|" * (len(KEYS) + 1)]
    for label in labels:
        lines.append(f"| {label} | " + " | ".join(_cell(recs, label, k) for k in KEYS) + " |")
    from experiments.reports import report  # (report does not import the probes)

    probes = {"gradient probe": recs}
    return [*lines, "", f"Code (commit of each probe record): {report.code_versions(probes)}; "
            f"hosts: {report.hosts(probes)}."]
