"""What the probes of a task's base policy share (`credit_probe`, `gradient_probe`): a trainer
on the base, its rollout batches sampled and scored as an RL step does, and one record per
seed under experiments/results/runs/<task>/, measured only when missing."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from ibpo_jax import config
from ibpo_jax.runtime import sharding
from ibpo_jax.trainer import loop


class Batch(NamedTuple):
    prompts: Any  # the encoded prompts (tokens [B, P], lengths [B])
    rollout: Any  # step.Rollout on the mesh
    correct: np.ndarray  # [N] bool, this process's rows
    infos: list[dict]  # the verifier's reports of those rows
    records: list[dict] | None = None  # [B] the problems, prompt-major (row i: i // G)


@contextlib.contextmanager
def base_trainer(cfg: config.RunConfig) -> Iterator[tuple[loop.Trainer, dict]]:
    """A trainer on `cfg`'s base policy in a throw-away workdir, and the base's identity."""
    with tempfile.TemporaryDirectory() as workdir:
        trainer = loop.Trainer(cfg, workdir, log=lambda *_: None)
        try:
            yield trainer, json.loads((Path(workdir) / "base.json").read_text())
        finally:
            trainer.close()


def sample_batch(trainer: loop.Trainer, k: int) -> Batch:
    """Rollout batch k of the base policy (the trainer's sampler, prompts and G), scored."""
    g = trainer.parts.cfg.rollout.group_size
    with jax.set_mesh(trainer.parts.mesh):  # placed like the trainer's own keys
        key = jax.random.fold_in(trainer.parts.seed_key, k)
    records, prompts, out = trainer.parts.collector.sample(key, trainer.policy)
    rows, tokens = sharding.local_rows(out.tokens)
    lengths = sharding.host_array(out.lengths)
    reward, correct, ended, infos = trainer.parts.collector.score(
        [records[i // g] for i in rows], tokens, lengths[rows])
    rollout, _ = trainer.parts.collector.as_rollout(prompts, out, rows, reward, correct, ended,
                                                    lengths)
    return Batch(prompts, rollout, correct, infos, records)


def seed_records(records_dir: Path, stem: str, seeds: int, measure: Callable[[int], dict], *,
                 probe: bool = True) -> list[dict]:
    """The records <stem>_s<seed>.json of seeds 0..seeds-1, measuring (`measure(seed)`, written
    atomically) those without one unless not `probe`; missing ones are left out."""
    records_dir.mkdir(parents=True, exist_ok=True)
    recs = []
    for seed in range(seeds):
        path = records_dir / f"{stem}_s{seed}.json"
        if not path.exists():
            if not probe:
                continue
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(measure(seed)) + "\n")
            os.replace(tmp, path)
        recs.append(json.loads(path.read_text()))
    return recs
