"""What an RL step records beside its metrics, from its credit and the verifier's reports:
Appendix A's per-row line (appendix_a.jsonl) and how often φ's first error agrees with the
checker's first wrong step. Both describe the trained rows only: a batch's invalid rows
(`Rollout.valid`, dynamic sampling's filler groups) are left out."""

from __future__ import annotations

import numpy as np

from ibpo_jax.runtime import sharding
from ibpo_jax.trainer import step


def _valid(rollout: step.Rollout, n: int) -> np.ndarray:
    """[n] bool: the rollout's valid rows (every row when `Rollout.valid` is None)."""
    return np.ones(n, bool) if rollout.valid is None else sharding.host_array(rollout.valid)


def appendix_a(s: int, cred: step.Credit, rollout: step.Rollout,
               rows: np.ndarray, infos: list[dict]) -> dict:
    """Step s's line of <workdir>/appendix_a.jsonl: the batch's per-row reward, φ, first
    error and the checker's true first wrong step (-1: none reported), read by
    notebooks/appendix_a.ipynb, for the groups holding a valid row (whole groups, so the
    line still reshapes to [groups, G]). Each process knows the checker's reports of its own
    rows (a collective: every process calls it)."""
    phi, first = (sharding.host_array(x).reshape(-1) for x in (cred.phi, cred.first_error))
    reward, correct = (sharding.host_array(x) for x in (rollout.reward, rollout.correct))
    truth = np.full(len(phi), -1)
    for i, info in zip(rows, infos):
        if info.get("first_wrong_step") is not None:
            truth[i] = info["first_wrong_step"]
    truth = sharding.process_max(truth)
    g = cred.phi.shape[1]
    keep = np.repeat(_valid(rollout, len(phi)).reshape(-1, g).any(axis=1), g)
    return {"step": s, "reward": reward[keep].tolist(),
            "correct": correct[keep].astype(int).tolist(),
            "phi": np.round(phi[keep], 5).tolist(), "first_error": first[keep].tolist(),
            "true_first_wrong": truth[keep].tolist()}


def first_error_agreement(cred: step.Credit, rollout: step.Rollout, rows: np.ndarray,
                          infos: list[dict], g: int) -> dict[str, float]:
    """How often φ's first-error position equals the checker's first wrong step (tasks whose
    checker reports one, e.g. arith): over the valid wrong responses of groups with a valid
    correct one. rows, infos: the rows this process scored and their checker reports (the
    counts are summed over processes)."""
    truth = [i.get("first_wrong_step") for i in infos]
    found = sharding.host_array(cred.first_error).reshape(-1)  # collective: every process
    correct = sharding.host_array(rollout.correct)
    valid = _valid(rollout, len(correct)).reshape(-1, g)
    groups = correct.reshape(-1, g) & valid
    scored = (~groups & valid & groups.any(axis=1, keepdims=True)).reshape(-1)
    pairs = [(int(found[i]), t) for i, t in zip(rows, truth) if scored[i] and t is not None]
    counts = sharding.process_sum(np.array([sum(f == t for f, t in pairs), len(pairs)], np.int64))
    if not counts[1]:
        return {}
    return {"first_error_agreement": float(counts[0] / counts[1])}
