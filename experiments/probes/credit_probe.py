"""The `credit` item: how often each credit signal finds the checker's true first wrong step.

No training: the warm-started base policy of the task samples `BATCHES` rollout batches per
seed (the run's own sampler, prompts and G), the `arith` checker marks each wrong response's
first wrong line, and every signal below names a step as the first error of each wrong
response that has a correct peer in its group (the responses φ scores). A signal is a
first-error rule (DESIGN §2: `lcs`, the first unit left unmatched by an optimal LCS alignment;
`prefix`, v1's longest prefix that is a subsequence) applied against one correct peer, chosen
by the operator's own score (the j* of `comparison.compute_phi`: φ's first error under that
operator), by majority over the correct peers (the paper's "majority of correct trajectories":
the most common first error, ties to the earliest), or by an oracle that picks, per response,
any peer whose first error is right (an upper bound on what choosing a peer can do). Two
signals read no single peer (issue 57): `peer_steps`, the first step no correct peer took in
the task's canonical form, and the policy's own Monte-Carlo completions of each step prefix
(the first prefix from which none of `COMPLETIONS` continuations is right), which needs no
peer at all.

Each seed's counts are a record under experiments/results/runs/<task>/credit_s<seed>.json, so
the report is rebuilt from committed records without sampling again.
"""

from __future__ import annotations

import functools
import json
import statistics
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from experiments import items as items_lib
from experiments.host import cpu_model, git_commit
from experiments.probes import base_probe
from ibpo_jax import config
from ibpo_jax.core import comparison
from ibpo_jax.core.units import step_budget
from ibpo_jax.runtime import sharding
from ibpo_jax.trainer import batching, credit, loop, step_labels, vouch

ROOT = Path(__file__).resolve().parents[2]

BATCHES = 8  # rollout batches per seed (arith_tiny: 8 x 32 prompts x G 8 = 2,048 responses)
OPERATORS = {"φ's peer (lcs_first_error)": "lcs_first_error", "LCS-ratio peer": "lcs",
             "edit-distance peer": "edit_distance"}
ALIGNMENTS = ("lcs", "prefix")


# Issue 57's operator, which reads no single peer: the first step no correct peer took, in the
# task's canonical form of a step where it has one (`peer_steps`, `Task.canonical_step`).
PEER_STEPS = "any peer's step: peer_steps"


# A signal no peer limits (issue 57): the first step end from which none of COMPLETIONS
# continuations sampled by the policy (temperature 1) is judged right, with the PRM's
# Monte-Carlo labels (`methods.prm.labels`). It reads the reward, never the checker's step.
COMPLETIONS = 8
COMPLETION = f"the policy's completions ({COMPLETIONS} a prefix): none right"
# Both checker-free signals err mostly early (a right step no correct peer took, a right prefix
# none of the continuations happened to finish right), and each "right" either sees is
# evidence. The `vouched_steps` operator (trainer/vouch.py) joins them: from the peers' first
# error it walks on while a continuation of the step's prefix is right. Measured as it runs in
# training, with its default and with 4x the continuations.
COMPLETION_LAST = f"the policy's completions ({COMPLETIONS} a prefix): after the last right one"
MORE_COMPLETIONS = 32
VOUCHED = {k: f"vouched_steps ({k} completions a prefix): from the peers' first error on, the "
              "first step whose prefix no completion finishes right"
           for k in (COMPLETIONS, MORE_COMPLETIONS)}


def signal_names() -> list[str]:
    return ([f"{rule}: {peer}" for rule in ALIGNMENTS
             for peer in (*OPERATORS, "majority of peers", "oracle peer")]
            + [PEER_STEPS, COMPLETION, COMPLETION_LAST, *VOUCHED.values()])


def first_none_right(labels: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """[n] the first valid step prefix whose Monte-Carlo label is 0 (labels, valid [n, S]; the
    last step is the response itself, judged wrong), S where there is none."""
    dead = valid & (labels == 0)
    return np.where(dead.any(1), dead.argmax(1), dead.shape[1]).astype(np.int64)


def after_last_right(labels: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """[n] one past the last valid step prefix some continuation completed right (labels > 0),
    0 where none did: every step up to it is right as far as a right completion can tell."""
    alive = valid & (labels > 0)
    return np.max(np.where(alive, np.arange(alive.shape[1]) + 1, 0), axis=1).astype(np.int64)


def completion_labels(trainer: loop.Trainer, batch: base_probe.Batch, rows: np.ndarray,
                      key: jax.Array, num_completions: int) -> tuple[np.ndarray, np.ndarray]:
    """(labels, valid) [len(rows), S]: Monte-Carlo labels of every step prefix of responses
    `rows` (`num_completions` continuations of each), as `methods.prm.labels` computes them."""
    from ibpo_jax.methods.prm import labels
    from ibpo_jax.sampler import sampling

    r, g = trainer.parts.cfg.rollout, trainer.parts.cfg.rollout.group_size
    host = lambda x: np.asarray(jax.device_get(x))[rows]  # noqa: E731
    prompt, prompt_len, response, response_len = (host(getattr(batch.rollout, f)) for f in (
        "prompt", "prompt_len", "response", "response_len"))
    complete = sampling.generate_fn(
        trainer.parts.base.config, trainer.parts.base.options, max_new_tokens=r.max_new_tokens,
        temperature=r.temperature, eos_ids=tuple(trainer.parts.tokenizer.eos_ids),
        pad_id=trainer.parts.tokenizer.pad_id, num_samples=num_completions,
        mesh=trainer.parts.mesh)

    def judge(m, tokens, lengths):
        recs = [batch.records[int(rows[i]) // g] for i in m]
        return trainer.parts.collector.score(recs, tokens, lengths)[1]

    with jax.set_mesh(trainer.parts.mesh):
        mc = labels.monte_carlo_labels(
            generate=complete, params=trainer.policy, prompt=prompt, prompt_len=prompt_len,
            response=response, response_len=response_len, is_delim=trainer.parts.tokenizer.is_delim,
            judge=judge, num_completions=num_completions, max_steps=response.shape[1],
            max_prompt_len=r.max_prompt_len + r.max_new_tokens,
            pad_id=trainer.parts.tokenizer.pad_id, key=key)
    return mc.labels, mc.valid


@jax.jit
def _peer_steps(units, n_units, correct):
    """First errors [B, G] of `peer_steps` on units [B, G, U]."""
    return jax.vmap(lambda u, n, c: comparison.compute_phi(
        u, n, c, operator="peer_steps"))(units, n_units, correct).first_error


def with_canonical_ids(trainer: loop.Trainer, rollout: credit.Rollout, slots: int
                       ) -> credit.Rollout:
    """`rollout` with the task's canonical step ids, as `step_labels.label` adds them in
    training (unchanged for a task without a canonical form)."""
    canonical = trainer.parts.task.canonical_step
    if canonical is None:
        return rollout
    response, lengths = (np.asarray(x) for x in (rollout.response, rollout.response_len))
    texts = batching.decode_responses(trainer.parts.tokenizer, response, lengths)
    ids, count = step_labels.canonical_ids(texts, canonical, slots)
    return rollout._replace(step_ids=ids, step_ids_len=count)


def peer_step_units(trainer: loop.Trainer, rollout: credit.Rollout, u: comparison.Units
                    ) -> np.ndarray:
    """[N, U] the units `peer_steps` compares in training (`step_labels.label`, then
    `credit.compared_units`): the task's canonical step ids, hashed steps where it has none."""
    units, _ = credit.compared_units(config.IbpoConfig(operator="peer_steps"),
                                     with_canonical_ids(trainer, rollout, u.units.shape[1]), u)
    return np.asarray(units)


def vouched_first_errors(trainer: loop.Trainer, batch: base_probe.Batch, key: jax.Array,
                         completions: int) -> np.ndarray:
    """[N] the `vouched_steps` operator's first errors, computed as training computes them
    (trainer/vouch.py: canonical ids, peers' first errors, `completions` continuations of each
    prefix that can move them, sampled by the base policy with the rollout's settings)."""
    parts, r = trainer.parts, trainer.parts.cfg.rollout
    ibpo = config.IbpoConfig(operator="vouched_steps", completions=completions)
    width = batch.rollout.response.shape[1]
    rollout = with_canonical_ids(trainer, batch.rollout, step_budget(width, None, "credit"))
    v = vouch.build(ibpo, r, batching.sampler(parts.cfg, parts.base.config, parts.base.options,
                                              parts.tokenizer, parts.mesh,
                                              num_samples=completions), parts.tokenizer)
    labelled, _, _ = vouch.label(
        v, rollout, records=batch.records, params=trainer.policy, key=key,
        score=functools.partial(batching.score_all_rows, parts.collector.pool, parts.tokenizer),
        mesh=parts.mesh)
    with jax.set_mesh(parts.mesh):
        first, _ = vouch.peer_first(labelled, jnp.asarray(v.is_delim), ibpo=ibpo,
                                    g=r.group_size)
    return np.maximum(sharding.host_array(first), sharding.host_array(labelled.step_vouched))


@functools.partial(jax.jit, static_argnames="alignment")
def _first_errors(units, n_units, correct, *, alignment):
    """Per signal of one alignment: first errors [B, G] of each operator's peer and the
    whole e [B, G, G] (one compiled program per alignment and batch shape)."""
    found = {peer: jax.vmap(lambda u, n, c, op=op: comparison.compute_phi(
        u, n, c, operator=op, alignment=alignment))(units, n_units, correct).first_error
        for peer, op in OPERATORS.items()}
    e = jax.vmap(lambda u, n: comparison.first_error_matrix(u, n, alignment=alignment))(
        units, n_units)
    return found, e


def _majority(e_row: np.ndarray, peers: np.ndarray) -> int:
    values, counts = np.unique(e_row[peers], return_counts=True)
    return int(values[np.argmax(counts)])  # np.unique sorts: ties go to the earliest


def count_batch(trainer: loop.Trainer, batch: base_probe.Batch, key: jax.Array | None = None
                ) -> dict[str, list[int]]:
    """[agree, earlier, later, scored] per signal for one rollout batch of the base policy."""
    g = trainer.parts.cfg.rollout.group_size
    rollout, correct, infos = batch.rollout, batch.correct, batch.infos
    u = comparison.response_units(rollout.response, rollout.response_len, rollout.ended,
                                  trainer.parts.is_delim, granularity="step")
    units, n_units = u.units.reshape(-1, g, u.units.shape[1]), u.n_units.reshape(-1, g)
    right = np.asarray(correct).reshape(-1, g)
    truth = np.array([-1 if i.get("first_wrong_step") is None else i["first_wrong_step"]
                      for i in infos]).reshape(-1, g)
    # The responses φ scores (the trainer's own rule), where the checker found a wrong step.
    scored = np.asarray(credit.phi_scored(right)) & (truth >= 0)
    counts = {}
    for alignment in ALIGNMENTS:
        found, e = jax.device_get(_first_errors(units, n_units, right, alignment=alignment))
        b_idx, i_idx = np.nonzero(scored)
        for peer in (*OPERATORS, "majority of peers", "oracle peer"):
            agree = early = late = 0
            for b, i in zip(b_idx, i_idx):
                t, peers = truth[b, i], right[b]
                if peer == "oracle peer":  # else the first peer's (for the early / late split)
                    f = t if np.any(e[b, i, peers] == t) else int(e[b, i, peers][0])
                elif peer == "majority of peers":
                    f = _majority(e[b, i], peers)
                else:
                    f = int(found[peer][b, i])
                agree, early, late = agree + (f == t), early + (f < t), late + (f > t)
            counts[f"{alignment}: {peer}"] = [int(agree), int(early), int(late), len(b_idx)]
    canon = peer_step_units(trainer, rollout, u).reshape(units.shape)
    found = np.asarray(_peer_steps(canon, n_units, right))[scored]
    t = truth[scored]
    counts[PEER_STEPS] = [int(np.sum(found == t)), int(np.sum(found < t)),
                          int(np.sum(found > t)), int(t.size)]
    if batch.records is not None and key is not None:
        labels, valid = completion_labels(trainer, batch, np.flatnonzero(scored), key,
                                          COMPLETIONS)
        signals = {COMPLETION: first_none_right(labels, valid),
                   COMPLETION_LAST: after_last_right(labels, valid)}
        for k, name in VOUCHED.items():
            signals[name] = vouched_first_errors(trainer, batch, key, k)[scored.reshape(-1)]
        for name, f in signals.items():
            counts[name] = [int(np.sum(f == t)), int(np.sum(f < t)), int(np.sum(f > t)),
                            int(t.size)]
    return counts


def measure(preset: str, extra: tuple, seed: int, batches: int) -> dict:
    """One seed's record: the summed counts of `batches` rollout batches and the command."""
    overrides = [*extra, ("seed", str(seed))]
    cfg = config.load(f"{ROOT / 'configs' / 'gspo.py'}:{preset}", overrides)
    total: dict[str, list[int]] = {}
    with base_probe.base_trainer(cfg) as (trainer, base):
        for k in range(batches):
            mc_key = jax.random.fold_in(jax.random.key(seed), 1_000 + k)  # completions'
            for name, c in count_batch(trainer, base_probe.sample_batch(trainer, k),
                                       mc_key).items():
                total[name] = [a + b for a, b in zip(total.get(name, [0, 0, 0, 0]), c)]
    commit, dirty = git_commit(ROOT)  # the code and host that measured it
    return {"preset": preset, "overrides": overrides, "base": base, "batches": batches,
            "counts": total, "commit": commit, "dirty": dirty, "cpu": cpu_model()}


def reproduce(*, preset: str, extra: tuple, seeds: int, records_dir: Path, out_dir: Path,
              command: str, batches: int = BATCHES, probe: bool = True) -> list[Path]:
    """Measures the seeds without a record (unless not `probe`), then writes credit.md /
    .json / .png from the records (nothing when there are none)."""
    recs = base_probe.seed_records(records_dir, "credit", seeds,
                                   lambda seed: measure(preset, extra, seed, batches),
                                   probe=probe)
    return write(recs, out_dir=out_dir, command=command, records_dir=records_dir) if recs else []


def probe(ctx: items_lib.ProbeContext) -> list[Path]:
    """The `probe` hook of the `credit` item (under --smoke: 1 batch per seed)."""
    return reproduce(preset=ctx.preset, extra=ctx.extra, seeds=ctx.seeds,
                     records_dir=ctx.records_dir, out_dir=ctx.out_dir, command=ctx.command,
                     batches=1 if ctx.smoke else BATCHES, probe=ctx.measure)


def _rates(recs: list[dict], name: str, which: int) -> list[float]:
    """Per record that measured signal `name` (older records lack `PEER_STEPS`)."""
    return [r["counts"][name][which] / max(r["counts"][name][3], 1) for r in recs
            if name in r["counts"]]


def _fmt(xs: list[float]) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{100 * statistics.mean(xs):.1f} ± {100 * sd:.1f}"


def write(recs: list[dict], *, out_dir: Path, command: str, records_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [n for n in signal_names() if any(n in r["counts"] for r in recs)]
    scored = [r["counts"][names[0]][3] for r in recs]
    lines = ["# Credit: how often each signal finds the checker's first wrong step", "",
             "No paper number: the paper locates the first error \"by sequence alignment\" "
             "and reports no accuracy for it; the embedded task's checker knows the truth.", "",
             f"Produced by `{command}` from the records in `{records_dir.name}/` "
             f"(`credit_s*.json`): the warm-started base policy, {recs[0]['batches']} rollout "
             f"batch(es) per seed, {len(recs)} seed(s), "
             + (f"{min(scored)}–{max(scored)}" if min(scored) < max(scored) else str(scored[0]))
             + " scored wrong responses per seed (wrong, with a correct peer, the checker "
             "naming a wrong line). Mean ± sd over seeds, in %.", "",
             "| first-error rule: peer | finds it | names an earlier step | a later step |",
             "|---|---|---|---|"]
    for name in names:
        lines.append(f"| {name} | {_fmt(_rates(recs, name, 0))} | "
                     f"{_fmt(_rates(recs, name, 1))} | {_fmt(_rates(recs, name, 2))} |")
    rate = lambda n: 100 * statistics.mean(_rates(recs, n, 0))  # noqa: E731
    real = [n for n in names if not n.endswith("oracle peer")]
    best = max(real, key=rate)
    short = f"default {rate(names[0]):.1f} %"
    why = (f"φ's default first error (LCS alignment, its own peer) finds the checker's first "
           f"wrong step for {rate(names[0]):.1f} % of the wrong responses it scores; the best "
           f"signal is \"{best}\" at {rate(best):.1f} %, and an oracle choice of the peer "
           f"would reach {rate('lcs: oracle peer'):.1f} % (lcs) / "
           f"{rate('prefix: oracle peer'):.1f} % (prefix)")
    if PEER_STEPS in names:  # issue 57's operator, measured by the newer records
        short += f"; peer_steps {rate(PEER_STEPS):.1f} %"
        why += (f"; `peer_steps` (the first step no correct peer took, in the task's canonical "
                f"form) finds it for {rate(PEER_STEPS):.1f} % "
                f"({len(_rates(recs, PEER_STEPS, 0))} seed(s))")
    if COMPLETION in names:  # no peer needed: the policy's own continuations of each prefix
        why += (f"; the policy's completions ({COMPLETIONS} a step prefix, the first prefix "
                f"none of them completes right) find it for {rate(COMPLETION):.1f} %")
    if all(v in names for v in VOUCHED.values()):  # the union of the two checker-free signals
        short += f"; vouched_steps {rate(VOUCHED[COMPLETIONS]):.1f} %"
        why += (f"; `vouched_steps` (from the peers' first error on, the first step whose prefix "
                f"no continuation finishes right) finds it for {rate(VOUCHED[COMPLETIONS]):.1f} "
                f"% with {COMPLETIONS} completions a prefix and "
                f"{rate(VOUCHED[MORE_COMPLETIONS]):.1f} % with {MORE_COMPLETIONS}")
    from experiments.reports import report  # (report does not import the probes)

    lines += ["", f"**Measured:** {why}.", "",
              f"Code (commit of each record): {report.code_versions({'credit': recs})}.", "",
              f"Hosts: {report.hosts({'credit': recs})}.", "", "![credit](credit.png)", "",
              f"*Share of the scored wrong responses whose first wrong step each signal finds, "
              f"mean over {len(recs)} seed(s); error bars ±1 sd over the seeds. Solid bars: "
              f"LCS alignment; hatched: prefix.*"]
    md, js, png = out_dir / "credit.md", out_dir / "credit.json", out_dir / "credit.png"
    md.write_text("\n".join(lines) + "\n")
    js.write_text(json.dumps({"verdict": short, "why": why, "seeds": len(recs)}) + "\n")
    _plot(recs, names, png)
    return [md, js, png]


def _plot(recs: list[dict], names: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    means = [100 * statistics.mean(_rates(recs, n, 0)) for n in names]
    sds = [100 * (statistics.stdev(_rates(recs, n, 0)) if len(_rates(recs, n, 0)) > 1 else 0.0)
           for n in names]
    fig, ax = plt.subplots(figsize=(8, 4))
    prefix = [n.startswith("prefix") for n in names]  # hatched: readable in grey too
    ax.barh(range(len(names)), means, xerr=sds, capsize=3, edgecolor="black",
            color=["#E69F00" if p else "#0072B2" for p in prefix])
    for bar, p in zip(ax.patches, prefix):
        bar.set_hatch("//" if p else "")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"finds the checker's first wrong step (%, mean ± 1 sd over {len(recs)} "
                  "seeds)")
    ax.set_xlim(0, 100)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
