"""Supervised warm start: teacher forcing on a task's reference solutions.

Used when the embedded `arith` task has no base policy yet (see `policy.load_base`): a random
tiny Qwen3 learns the answer format and most of the arithmetic in a few hundred steps, so RL
starts from a policy whose groups hold both correct and wrong answers. The result is written
atomically (temporary directory, then rename) as an HF checkpoint.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm

from ibpo_jax import models
from ibpo_jax.config import RunConfig
from ibpo_jax.data.sampler import IndexSampler
from ibpo_jax.trainer import policy
from ibpo_jax.trainer.batching import encode_supervised

WARM_START_SEED = 0  # the base policy is shared by every RL seed that starts from it


def supervised_batches(cfg: RunConfig, task: Any, tokenizer: Any) -> tuple[np.ndarray, ...]:
    """All (tokens, attention, loss_mask) of the training split, tokenized once."""
    records = task.split(cfg.task.train_split)
    prompts, targets = [], []
    for i in range(len(records)):
        reference = task.reference_text(records[i])
        if reference is None:
            raise ValueError(f"warm_start: task {cfg.task.name!r} record {i} has no reference "
                             "solution; disable config.warm_start.enabled or give a checkpoint")
        prompts.append(task.prompt_text(records[i]))
        targets.append(reference)
    return encode_supervised(tokenizer, prompts, targets,
                             max_prompt_len=cfg.rollout.max_prompt_len,
                             max_target_len=cfg.rollout.max_new_tokens)


def run(cfg: RunConfig, *, task: Any, tokenizer: Any, out_dir: Path, log) -> None:
    ws = cfg.warm_start
    tokens, attention, loss_mask = supervised_batches(cfg, task, tokenizer)
    arch = policy.architecture(cfg, tokenizer.vocab_size)
    m = models.init(arch, jax.random.key(WARM_START_SEED), dtype=jnp.dtype(cfg.model.param_dtype))
    schedule = optax.warmup_cosine_decay_schedule(0.0, ws.lr, ws.warmup_steps, ws.steps,
                                                  end_value=ws.lr * 0.05)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0),
                            optax.adamw(schedule, weight_decay=0.01))
    opt_state = optimizer.init(m.params)

    def loss_fn(params, tok, att, lmask):
        lp = models.token_logprobs(m.config, m.options, params, tok, att).logprobs
        return -jnp.sum(jnp.where(lmask, lp, 0.0)) / jnp.maximum(lmask.sum(), 1)

    @jax.jit
    def train_step(params, opt_state, tok, att, lmask):
        loss, grads = jax.value_and_grad(loss_fn)(params, tok, att, lmask)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    sampler = IndexSampler(len(tokens), seed=WARM_START_SEED)
    params = m.params
    start = time.time()
    bar = tqdm.trange(ws.steps, desc="warm start", dynamic_ncols=True, file=sys.stderr,
                      disable=not cfg.train.progress)
    for step in bar:
        idx = np.sort(sampler.next_indices(ws.batch_size))
        params, opt_state, loss = train_step(params, opt_state, tokens[idx], attention[idx],
                                             loss_mask[idx])
        if step % 25 == 0 or step == ws.steps - 1:
            bar.set_postfix(loss=f"{float(loss):.4f}")
    log(f"warm start: {ws.steps} steps in {time.time() - start:.0f}s, final loss {float(loss):.4f}")
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    models.save_hf(models.Qwen3LM(m.config, m.options, params), tmp)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, out_dir)  # atomic; a concurrent run that finished first wins
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out_dir / "config.json").exists():
            raise
