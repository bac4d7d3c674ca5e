"""Writes ibpo_walkthrough.ipynb from the cells below (run: python notebooks/make_walkthrough.py).

The notebook is generated so its code stays reviewable as plain Python; tests/test_notebooks.py
executes every code cell, so it cannot rot.
"""

import json
from pathlib import Path

CELLS = [
    ("markdown", """# IBPO, step by step

One group of responses to an `arith` problem, through the comparison operator φ (DESIGN §2),
the shaped advantages (eq. 5, eqs. 10-11), and the token gradient cancellation diagnostics
(DESIGN §5). Every number below comes from the library's jitted functions."""),
    ("code", """import jax.numpy as jnp
import numpy as np

from ibpo_jax.config import LossConfig  # a losses.LossSpec with documented, checked fields
from ibpo_jax.core import advantages, cancellation, comparison, losses
from ibpo_jax.data import arith
from ibpo_jax.data.tokenizer import CharTokenizer

record = arith.make_record(37, "+-*", [48, 19, 2], id="demo")
print(record["question"])
print(record["reference"])"""),
    ("markdown", """## A group of G = 6 responses
Two are correct; the wrong ones go astray at different steps. The checker knows the true first
wrong step, which φ's alignment should recover."""),
    ("code", """responses = [
    record["reference"],                                   # correct
    "37+48=85\\n85-19=66\\n66*2=132\\nAnswer: 132",            # correct
    "37+48=85\\n85-19=67\\n67*2=134\\nAnswer: 134",            # wrong at step 1
    "37+48=85\\n85-19=66\\n66*2=1320\\nAnswer: 1320",          # wrong at step 2
    "37+48=95\\n95-19=76\\n76*2=152\\nAnswer: 152",            # wrong at step 0
    "37+48=85\\n85-19=66\\n66*2=132\\nAnswer: 1320",           # wrong at the answer line
]
checks = [arith.check(r, record) for r in responses]
for c in checks:
    print(f"correct={c.correct!s:5}  first wrong step={c.first_wrong_step}")"""),
    ("code", """tok = CharTokenizer()
T = 64
tokens = np.zeros((len(responses), T), np.int32)
lengths = np.array([len(r) for r in responses], np.int32)
for i, r in enumerate(responses):
    tokens[i, : len(r)] = tok.encode(r)
units, n_units = [jnp.stack(x) for x in zip(*[
    comparison.split_steps(jnp.asarray(t), n, jnp.asarray(tok.is_delim), max_units=8)
    for t, n in zip(tokens, lengths)])]
correct = jnp.array([c.correct for c in checks])
print("units per response:", n_units)"""),
    ("markdown", """## φ under each operator
`lcs_first_error` (the default) aligns a wrong response with each correct one (an optimal
LCS alignment, `alignment="lcs"`); its first error is the first step the alignment leaves
unmatched, and φ the share of steps before it. Here the first-error positions match the
checker's first wrong steps."""),
    ("code", """for op in ("terminal", "edit_distance", "lcs", "lcs_first_error"):
    out = comparison.compute_phi(units, n_units, correct, operator=op)
    print(f"{op:16s} phi = {np.round(np.asarray(out.phi), 3)}")
phi = comparison.compute_phi(units, n_units, correct, operator="lcs_first_error")
print("first error (φ)   :", np.asarray(phi.first_error))
print("first wrong (true):", [c.first_wrong_step for c in checks])
print("Δ per step:\\n", np.asarray(phi.delta))"""),
    ("markdown", """## Shaped advantages and Appendix A
r̃ = R + λφ (eq. 5). Within the group, Var(A^IBPO) = Var(A^GSPO) − 2λC + λ²V_φ (Theorem A.2,
an equality for population moments), so the variance shrinks for 0 < λ < λ_max = 2C / V_φ."""),
    ("code", """R = jnp.where(correct, 1.0, -1.0)
lam = 0.5
print("A (GSPO):", np.round(np.asarray(advantages.group_advantages(R, jnp.zeros(6), lam=lam)), 3))
print("A (IBPO):", np.round(np.asarray(advantages.group_advantages(R, phi.phi, lam=lam)), 3))
stats = advantages.appendix_a_stats(R, phi.phi, lam=lam)
print({k: round(float(v), 4) for k, v in stats.items()})"""),
    ("markdown", """## Token gradient cancellation
The six responses share the prefix `37+48=` (and more). With `seq_mean_token_mean` the 1/|y_i|
weights differ between responses of different lengths, so the gradient on shared tokens does
not cancel (residual > 0); `token_mean` keeps the weights exchangeable (residual 0), and the
`min_replace` transform restores cancellation for any objective."""),
    ("code", """mask = jnp.arange(T)[None, :] < jnp.asarray(lengths)[:, None]
adv = advantages.group_advantages(R, phi.phi, lam=lam)
logp = jnp.full((6, T), -1.0)
for agg in ("seq_mean_token_mean", "token_mean"):
    spec = LossConfig(name="grpo", aggregation=agg, clip_eps_low=0.2, clip_eps_high=0.2)
    w = losses.token_weights(spec, logp=logp, old_logp=logp, adv=adv, mask=mask)
    a_tok = jnp.broadcast_to(adv[:, None], (6, T))
    res = cancellation.cancellation_residual(jnp.asarray(tokens), mask, a_tok, w)
    w2 = cancellation.apply_transform(jnp.asarray(tokens), mask, a_tok, w,
                                      transform="min_replace")
    res2 = cancellation.cancellation_residual(jnp.asarray(tokens), mask, a_tok, w2)
    print(f"{agg:20s} residual = {float(res):.4f}   after min_replace = {float(res2):.2e}")"""),
]


def main() -> None:
    nb = {
        "cells": [
            {"cell_type": kind, "metadata": {}, "source": src.splitlines(keepends=True),
             **({"outputs": [], "execution_count": None} if kind == "code" else {})}
            for kind, src in CELLS
        ],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                    "name": "python3"},
                     "language_info": {"name": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    out = Path(__file__).with_name("ibpo_walkthrough.ipynb")
    out.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
