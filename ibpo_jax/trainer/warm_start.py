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
from ibpo_jax.config import ConfigError, RunConfig
from ibpo_jax.data import followups
from ibpo_jax.data.sampler import IndexSampler
from ibpo_jax.trainer import rounds
from ibpo_jax.trainer.batching import encode_supervised

WARM_START_SEED = 0  # the base policy is shared by every RL seed that starts from it


def supervised_batches(cfg: RunConfig, task: Any, tokenizer: Any) -> tuple[np.ndarray, ...]:
    """All (tokens, attention, loss_mask) of the training split, tokenized once."""
    records = task.split(cfg.task.train_split)
    prompts, targets = [], []
    for i in range(len(records)):
        reference = task.reference_text(records[i])
        if reference is None:
            raise ConfigError(f"warm_start: task {cfg.task.name!r} record {i} has no reference "
                             "solution; disable config.warm_start.enabled or give a checkpoint")
        prompts.append(task.prompt_text(records[i]))
        targets.append(reference)
    return encode_supervised(tokenizer, prompts, targets,
                             max_prompt_len=cfg.rollout.max_prompt_len,
                             max_target_len=cfg.rollout.max_new_tokens)


def corrupt(text: str, rng: np.random.Generator) -> str:
    """`text` with one digit changed (a wrong step, for the second-round examples)."""
    digits = [i for i, ch in enumerate(text) if ch.isdigit()]
    if not digits:
        return text + "0"
    i = int(rng.choice(digits))
    return text[:i] + str((int(text[i]) + int(rng.integers(1, 10))) % 10) + text[i + 1:]


def followup_batches(cfg: RunConfig, task: Any, tokenizer: Any) -> tuple[np.ndarray, ...]:
    """Second-round examples (warm_start.followups): for each training problem, a correction
    prompt (a corrupted reference as the wrong response, the reference as the right one) or a
    retry prompt (after the reference or a corrupted one), alternately; the target is the
    reference. Prompts are encoded at the correction round's width."""
    rng = np.random.default_rng(WARM_START_SEED)
    records = task.split(cfg.task.train_split)
    prompts, targets = [], []
    for i in range(len(records)):
        ref = task.reference_text(records[i])
        if i % 2 == 0:
            prompts.append(followups.correction_prompt(task, records[i], wrong=corrupt(ref, rng),
                                                       right=ref))
        else:
            attempt = corrupt(ref, rng) if rng.random() < 0.5 else ref
            prompts.append(followups.retry_prompt(task, records[i], attempt=attempt))
        targets.append(ref)
    r = cfg.rollout
    return encode_supervised(tokenizer, prompts, targets,
                             max_prompt_len=r.max_prompt_len + 2 * r.max_new_tokens
                             + rounds.TEMPLATE_ROOM, max_target_len=r.max_new_tokens)


def run(cfg: RunConfig, *, task: Any, tokenizer: Any, arch: models.Qwen3Config, out_dir: Path,
        log) -> None:
    """Warm-starts a random `arch` on the task's reference solutions into HF directory
    `out_dir`."""
    ws = cfg.warm_start
    data = [supervised_batches(cfg, task, tokenizer)]
    if ws.followups:  # every 5th step a batch of second-round examples: steps // 4 extra
        data.append(followup_batches(cfg, task, tokenizer))
    total = ws.steps + (ws.steps // 4 if ws.followups else 0)
    m = models.init(arch, jax.random.key(WARM_START_SEED), dtype=jnp.dtype(cfg.model.param_dtype))
    schedule = optax.warmup_cosine_decay_schedule(0.0, ws.lr, ws.warmup_steps, total,
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

    samplers = [IndexSampler(len(d[0]), seed=WARM_START_SEED + k) for k, d in enumerate(data)]
    params = m.params
    start = time.time()
    bar = tqdm.trange(total, desc="warm start", dynamic_ncols=True, file=sys.stderr,
                      disable=not cfg.train.progress)
    for step in bar:
        k = int(ws.followups and step % 5 == 4)
        idx = np.sort(samplers[k].next_indices(ws.batch_size))
        tokens, attention, loss_mask = (x[idx] for x in data[k])
        params, opt_state, loss = train_step(params, opt_state, tokens, attention, loss_mask)
        if step % 25 == 0 or step == total - 1:
            bar.set_postfix(loss=f"{float(loss):.4f}")
    log(f"warm start: {total} steps in {time.time() - start:.0f}s, final loss {float(loss):.4f}")
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
