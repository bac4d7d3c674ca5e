"""Writes and executes notebooks/appendix_a.ipynb, the variance analysis of Appendix A.

    python notebooks/make_appendix_a.py                    # the committed 3-seed records
    python notebooks/make_appendix_a.py --runs 'runs/ibpo_gspo_s*'
    python notebooks/make_appendix_a.py --smoke --out /tmp/nb   # trains a smoke run first
    python notebooks/make_appendix_a.py --export runs/reproduce/arith_long/ibpo_gspo_s* \
        --until 200 --runs 'experiments/results/appendix_a_rows/arith_long/*'

The notebook reads run directories (or the compact copies committed under
experiments/results/appendix_a_rows/<task>/, by default `arith_long`'s three IBPO-GSPO runs
on its committed base): `config.json`, `metrics.jsonl` (the `pg_var*`,
`cov_y_phi`, `lambda_max`, `first_error_agreement` keys logged every
`diagnostics.grad_var_every` steps) and `appendix_a.jsonl` (per-row reward, φ, first error and
the checker's true first wrong step at those steps). It is executed here with its outputs and
figures embedded, so it reads without running; `appendix_a_pg_variance.png` is the key figure
(the README shows it). tests/test_notebooks.py executes it on a smoke run so it cannot rot.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ROWS = ROOT / "experiments/results/appendix_a_rows"  # <task>/<run name>/ per exported run
DEFAULT_RUNS = "experiments/results/appendix_a_rows/arith_long/*"

CELLS = [
    ("markdown", """# Appendix A, measured

The IBPO paper's Appendix A makes two claims about the shaped advantage A = R + λφ (eqs. 10-11):

1. **Cov(Y, φ) < 0** at every checkpoint: wrong responses (Y = -1) get larger φ than the correct
   ones (whose φ is 0), so φ is anti-correlated with the reward;
2. **IBPO lowers the policy-gradient variance by about 30 %** on average.

This notebook measures both on run directories of this project (DESIGN §3): the pooled
Cov(Y, φ) of each logged step's batch, and the variance across groups of the per-group gradient
of the run's own loss (its normalization, aggregation and KL), computed twice on the same
trajectories, with the run's λ and with λ = 0 (plain GSPO advantages). A drop of the
*unnormalized advantage* variance for λ < λ_max follows from algebra alone and confirms
nothing; after division by the group std it is 1 either way. Only the gradient variance tests
the claim."""),
    ("code", """import glob
import json
import os
from pathlib import Path

import matplotlib.pyplot as plt  # the kernel's inline backend embeds each figure
import numpy as np

from ibpo_jax.core import advantages

RUNS = os.environ.get("APPENDIX_A_RUNS", "experiments/results/appendix_a_rows/arith_long/*")
FIG_DIR = Path(os.environ.get("APPENDIX_A_FIG_DIR", "notebooks"))
dirs = sorted(d for d in glob.glob(RUNS) if Path(d, "metrics.jsonl").exists())
assert dirs, f"no run directories match {RUNS!r}"


def read_jsonl(path):
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a torn last line of a killed run
            pass
    return rows


runs = []
for d in dirs:
    cfg = json.loads(Path(d, "config.json").read_text())
    rows = read_jsonl(Path(d, "metrics.jsonl"))
    diag = [r for r in rows if "pg_var" in r]
    recs = read_jsonl(Path(d, "appendix_a.jsonl")) if Path(d, "appendix_a.jsonl").exists() else []
    recs = list({r["step"]: r for r in recs}.values())  # a resumed run may repeat a step
    runs.append(dict(name=Path(d).name, cfg=cfg, rows=rows, diag=diag, recs=recs))
# One colour per run (seed) on every figure; IBPO against λ = 0 is told by line style and
# marker, never by colour (the histograms use grey for λ = 0 and black for IBPO).
for i, r in enumerate(runs):
    r["colour"] = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9")[i % 6]
    print(f"{Path(d).name}: {cfg['algo']}, λ = {cfg['ibpo']['lam']}, seed {cfg['seed']}, "
          f"{len(diag)} diagnostic steps, {len(recs)} per-row records")"""),
    ("markdown", """## Claim (i): Cov(Y, φ) < 0 at every logged step
Pooled over the batch's groups: Σ of within-group covariances over the total count (groups with
one outcome add 0)."""),
    ("code", """fig, ax = plt.subplots(figsize=(6, 3.2))
neg, total = 0, 0
for r in runs:
    steps = [x["step"] for x in r["diag"]]
    cov = [x["cov_y_phi"] for x in r["diag"]]
    ax.plot(steps, cov, marker="o", ms=3, color=r["colour"], label=r["name"])
    neg += sum(c < 0 for c in cov)
    total += len(cov)
ax.axhline(0, color="k", lw=0.8)
ax.set_xlabel("RL step")
ax.set_ylabel("pooled Cov(Y, φ) (reward × φ)")
ax.legend(fontsize=7)
ax.set_title("Claim (i): Cov(Y, φ) per logged step")
fig.tight_layout()
fig.savefig(FIG_DIR / "appendix_a_cov.png", dpi=110)
plt.show()
claim_i = neg == total and total > 0
print(f"Cov(Y, φ) < 0 at {neg} of {total} logged steps -> claim (i) "
      f"{'holds' if claim_i else 'does not hold'} here")"""),
    ("markdown", """## Claim (ii): policy-gradient variance, IBPO vs GSPO on the same trajectories
`pg_var` = Σ_b ‖g_b − ḡ‖² / (B − 1) over the B groups of the batch, g_b the gradient of the
run's loss restricted to group b; `pg_var_gspo` the same with λ = 0. ‖ḡ‖² is shown too: a
lower variance with an equally lower ‖ḡ‖² would be a smaller gradient, not a cleaner one."""),
    ("code", """fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
per_run = []
for r in runs:
    s = np.array([x["step"] for x in r["diag"]])
    v, v0 = (np.array([x[k] for x in r["diag"]]) for k in ("pg_var", "pg_var_gspo"))
    m, m0 = (np.array([x.get(k, np.nan) for x in r["diag"]])
             for k in ("pg_mean_sqnorm", "pg_mean_sqnorm_gspo"))
    c = r["colour"]
    axes[0].semilogy(s, v, color=c, marker="o", ms=3, label=f"{r['name']} IBPO")
    axes[0].semilogy(s, v0, color=c, ls="--", marker="x", ms=3, label=f"{r['name']} λ = 0")
    axes[1].plot(s, v / v0, color=c, marker="o", ms=3, label=r["name"])
    axes[2].plot(s, (v / m) / (v0 / m0), color=c, marker="o", ms=3, label=r["name"])
    per_run.append((np.mean(v / v0), np.mean((v / m) / (v0 / m0))))
axes[0].set_title("PG variance (solid: IBPO, dashed: λ = 0)")
axes[0].set_ylabel("PG variance across groups (grad²)")
axes[1].set_ylabel("IBPO / λ = 0 (ratio)")
axes[2].set_ylabel("IBPO / λ = 0 (ratio)")
axes[1].legend(fontsize=6)
axes[0].set_xlabel("RL step")
axes[0].legend(fontsize=6)
axes[1].axhline(1, color="k", lw=0.8)
axes[1].axhline(0.7, color="grey", lw=0.9, ls=":")
axes[1].set_title("pg_var / pg_var_gspo (dotted: the paper's 0.70)")
axes[1].set_xlabel("RL step")
axes[2].axhline(1, color="k", lw=0.8)
axes[2].set_title("(var / ‖ḡ‖²) ratio: noise relative to signal")
axes[2].set_xlabel("RL step")
fig.tight_layout()
fig.savefig(FIG_DIR / "appendix_a_pg_variance.png", dpi=110)
plt.show()
ratios = np.array([p[0] for p in per_run])
snr = np.array([p[1] for p in per_run])
sd = lambda x: x.std(ddof=1) if len(x) > 1 else float("nan")
print(f"mean PG-variance ratio IBPO / GSPO over {len(ratios)} run(s): "
      f"{ratios.mean():.3f} ± {sd(ratios):.3f} (per run: {np.round(ratios, 3).tolist()})")
print(f"variance relative to ‖ḡ‖², ratio: {snr.mean():.3f} ± {sd(snr):.3f}")
claim_ii = ratios.mean() <= 0.8
print(f"paper: about 0.70 -> claim (ii) {'holds' if claim_ii else 'does not hold'} here "
      f"(criterion: mean ratio <= 0.8)")"""),
    ("markdown", """## Advantage distributions with and without φ
From the per-row records: the unnormalized advantages of eqs. 10-11 (whose variance drop is
algebra) and the std-normalized ones training uses (variance 1 in every mixed group either
way)."""),
    ("code", """recs = [(r, rec) for r in runs for rec in r["recs"]]
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
if recs:
    raw, raw0, nrm, nrm0 = [], [], [], []
    for r, rec in recs:
        g, lam = r["cfg"]["rollout"]["group_size"], r["cfg"]["ibpo"]["lam"]
        y = np.array(rec["reward"], np.float32).reshape(-1, g)
        phi = np.array(rec["phi"], np.float32).reshape(-1, g)
        mixed = y.min(1) < y.max(1)
        y, phi = y[mixed], phi[mixed]
        raw.append((y + lam * phi - (y + lam * phi).mean(1, keepdims=True)).ravel())
        raw0.append((y - y.mean(1, keepdims=True)).ravel())
        nrm.append(np.asarray(advantages.group_advantages(y, phi, lam=lam)).ravel())
        nrm0.append(np.asarray(advantages.group_advantages(y, 0 * phi, lam=lam)).ravel())
    for ax, (a, a0, t) in zip(axes, ((raw, raw0, "unnormalized (eqs. 10-11)"),
                                     (nrm, nrm0, "std-normalized (as trained)"))):
        a, a0 = np.concatenate(a), np.concatenate(a0)
        bins = np.linspace(min(a.min(), a0.min()), max(a.max(), a0.max()), 41)
        ax.hist(a0, bins, color="lightgrey", label=f"λ = 0: var {a0.var():.3f}")
        ax.hist(a, bins, histtype="step", color="black", lw=1.2,
                label=f"IBPO: var {a.var():.3f}")
        ax.set_title(t + ", all runs")
        ax.set_xlabel("advantage (reward units)")
        ax.set_ylabel("responses")
        ax.legend(fontsize=8)
fig.tight_layout()
plt.show()"""),
    ("markdown", """## λ_max against the run's λ
Theorem A.2: the unnormalized advantage variance drops iff 0 < λ < λ_max = 2C / V_φ (pooled)."""),
    ("code", """fig, ax = plt.subplots(figsize=(6, 3.2))
for r in runs:
    s = [x["step"] for x in r["diag"]]
    ax.plot(s, [x["lambda_max"] for x in r["diag"]], marker="o", ms=3, color=r["colour"],
            label=r["name"])
ax.axhline(runs[0]["cfg"]["ibpo"]["lam"], color="grey", ls=":", label="the runs' λ")
ax.set_xlabel("RL step")
ax.set_ylabel("pooled λ_max (λ units)")
ax.legend(fontsize=7)
fig.tight_layout()
plt.show()
lmax = np.array([x["lambda_max"] for r in runs for x in r["diag"]])
print(f"λ_max: median {np.median(lmax):.2f}, range [{lmax.min():.2f}, {lmax.max():.2f}]; "
      f"λ = {runs[0]['cfg']['ibpo']['lam']}")"""),
    ("markdown", """## Does φ's first error find the true first wrong step?
The embedded `arith` checker knows the first wrong step of every wrong response: φ by that
step, and how often the alignment's first error equals it (`first_error_agreement`)."""),
    ("code", """fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
by_step = {}
for r, rec in recs:
    g = r["cfg"]["rollout"]["group_size"]
    correct = np.array(rec["correct"], bool).reshape(-1, g)
    scored = (~correct & correct.any(1, keepdims=True)).ravel()
    for phi, t, ok in zip(rec["phi"], rec["true_first_wrong"], scored):
        if ok and t >= 0:
            by_step.setdefault(min(t, 6), []).append(phi)
if by_step:
    keys = sorted(by_step)
    axes[0].boxplot([by_step[k] for k in keys],
                    tick_labels=[str(k) if k < 6 else "6+" for k in keys])
    axes[0].set_xlabel("checker's first wrong step")
    axes[0].set_ylabel("φ")
for r in runs:
    pts = [(x["step"], x["first_error_agreement"]) for x in r["rows"]
           if "first_error_agreement" in x]
    if pts:
        axes[1].plot(*zip(*pts), lw=0.8, color=r["colour"], label=r["name"])
axes[1].set_ylim(0, 1.02)
axes[1].set_xlabel("RL step")
axes[1].set_title("first-error agreement")
axes[1].set_ylabel("agreement with the checker (fraction)")
axes[1].legend(fontsize=7)
fig.tight_layout()
plt.show()
agree = [x["first_error_agreement"] for r in runs for x in r["rows"]
         if "first_error_agreement" in x]
print(f"first-error agreement: {np.mean(agree):.3f} over {len(agree)} steps" if agree else
      "no first-error agreement logged")"""),
    ("markdown", """## Verdict"""),
    ("code", """print("| claim | paper | here | holds? |")
print("|---|---|---|---|")
print(f"| (i) Cov(Y, φ) < 0 at every checkpoint | yes | {neg} of {total} steps | "
      f"{'yes' if claim_i else 'no'} |")
print(f"| (ii) PG variance IBPO / GSPO | ≈ 0.70 | {ratios.mean():.3f} ± {sd(ratios):.3f} "
      f"({len(ratios)} runs) | {'yes' if claim_ii else 'no'} |")"""),
]


def build(path: Path) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell(src) if kind == "markdown"
                else nbformat.v4.new_code_cell(src) for kind, src in CELLS]
    nbformat.write(nb, path)


def execute(path: Path, *, runs: str, fig_dir: Path, timeout: int = 600) -> None:
    """Executes the notebook in place (outputs and figures embedded), from the repo root."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    env = {"APPENDIX_A_RUNS": runs, "APPENDIX_A_FIG_DIR": str(fig_dir)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits the environment
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(ROOT)}}).execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    nbformat.write(nb, path)


def smoke_runs(out: Path) -> str:
    """Two tiny IBPO-GSPO runs (seeds 0, 1) with the diagnostics every step."""
    from ibpo_jax import config
    from ibpo_jax.trainer import loop

    for seed in (0, 1):
        cfg = config.load("configs/ibpo_gspo.py:smoke", [
            ("seed", str(seed)), ("train.steps", "2"), ("diagnostics.grad_var_every", "1"),
            ("train.progress", "false")])
        loop.run(cfg, workdir=out / f"smoke_s{seed}")
    return str(out / "smoke_s*")


def export(run_dirs: list[Path], dest: Path, *, until: int | None = None) -> None:
    """Copies what the notebook reads of each run (config.json, the metrics rows' diagnostic
    keys, appendix_a.jsonl; steps <= `until` if given, as a record cut there) to
    dest/<task>/<run name>/ (the task: the run directory's parent, as the driver lays them
    out): the compact records committed for a fresh clone, where the run directories
    themselves are not."""
    def upto(lines: list[str]) -> list[dict]:
        rows = [json.loads(line) for line in lines if line.strip()]
        return [r for r in rows if until is None or r["step"] <= until]

    keys = ("step", "eval_accuracy", "accuracy", "cov_y_phi", "lambda_max", "pg_var",
            "pg_var_gspo", "pg_var_ratio", "pg_mean_sqnorm", "pg_mean_sqnorm_gspo",
            "first_error_agreement", "phi_mean", "adv_var", "adv_var_gspo", "time_pg_var_s",
            "time_total_s")
    for run in run_dirs:
        out = dest / run.resolve().parent.name / run.name
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text((run / "config.json").read_text())
        rows = upto((run / "metrics.jsonl").read_text().splitlines())
        (out / "metrics.jsonl").write_text("".join(
            json.dumps({k: r[k] for k in keys if k in r}) + "\n" for r in rows))
        (out / "appendix_a.jsonl").write_text("".join(
            json.dumps(r, separators=(",", ":")) + "\n"
            for r in upto((run / "appendix_a.jsonl").read_text().splitlines())))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default=DEFAULT_RUNS, help="glob of run directories")
    p.add_argument("--smoke", action="store_true", help="train two smoke runs and analyse them")
    p.add_argument("--out", type=Path, default=HERE, help="where the notebook and PNGs go")
    p.add_argument("--export", type=Path, nargs="*", default=None,
                   help="run directories to copy (compactly) to experiments/results/"
                   "appendix_a_rows/<task>/ before analysing them")
    p.add_argument("--until", type=int, default=None,
                   help="--export only the steps up to this one (a run cut there)")
    args = p.parse_args(argv)
    if args.export:
        export(args.export, ROWS, until=args.until)
    args.out.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)
    runs = smoke_runs(args.out / "runs") if args.smoke else args.runs
    path = args.out / "appendix_a.ipynb"
    build(path)
    execute(path, runs=runs if Path(runs).is_absolute() else str(ROOT / runs), fig_dir=args.out)
    print(f"wrote {path} and {args.out}/appendix_a_*.png")


if __name__ == "__main__":
    main()
