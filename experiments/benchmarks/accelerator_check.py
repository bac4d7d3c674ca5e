"""One-command accelerator check: the figures a lent GPU / TPU should give us, in <= 8 minutes.

On the first device (`jax.devices()[0]`), with a random `qwen3_0.6b`-shaped Qwen3 (the
`qwen3-0.6b` preset of ibpo_jax/models/config.py) run as `configs/ibpo_gspo.py:qwen3_0.6b_math`
runs it (bfloat16 compute, float32 master weights, "dots" remat, scanned layers, 1024-position
logit chunks), it measures, in sections:

  peak      bf16 matmul rate (n x n @ n x n, chained in one jit): the MFU denominator.
  train     LM train step (next-token NLL + the preset's AdamW) on B x T random tokens:
            tokens/s and MFU against `peak`.
  sampler   our KV-cache sampler (`sampling.generate_fn`), 16 prompts x 8 samples = 128 rows,
            1024 new tokens each (no EOS, so every row runs them all): generated tokens/s.
  phi       `comparison.compute_phi` (lcs_first_error) vmapped over groups of G = 8 responses of
            4k-8k tokens (DESIGN §2), and `comparison.lcs_first_error` vmapped over pairs of 8k:
            DP cells/s, cells = Σ len_a·len_b over every pair the kernel computes (G×G per group).
  rl_step   one RL step (`trainer.step.credit` + `trainer.step.update`, jitted as the Trainer
            jits them), the preset's per-row shapes (prompt 1024, 8192 new tokens, G = 8,
            max_units 0 = every step), 2 prompts (the preset's 128 are sized for 8 fsdp
            devices), on a synthetic rollout: seconds, tokens/s, MFU. If the compiled update
            needs more than the device's free memory (attention scores are materialized:
            XLA:CPU assigns ~297 / 131 / 69 GB of temporaries at 8192 / 4096 / 2048 new
            tokens; XLA:GPU 217 GiB at 8192), the new tokens are halved, at most twice, and
            the lines say so.

Model FLOPs (stated in each line): 6·N per trained token, 2·N per forward-only one, N = matmul
weights incl. the tied unembedding, plus causal attention, 4·L·heads·head_dim per (query,
visible key) forward, x3 with backward. Remat recomputation and padding are not counted.

Output: one JSON line per figure on stdout (name, value, unit, device_kind, shapes, ...), one
per section (seconds, budget, status: "ok" or its error; later sections still run), and the
total. A section's timing loop stops at its budget (after the first call and one timed call); a
watchdog ends the process at 8 min (budgets x --budget-scale). `--tiny` shrinks every shape for
a CPU run (tests/test_accelerator_check.py).

    python experiments/benchmarks/accelerator_check.py [--tiny] [--sections peak,train,...]
        [--rl-override key=value ...] (rl_step config overrides) [--budget-scale X]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from bench_phi_tiling import group_units  # the sibling script: φ's benchmark inputs
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ibpo_jax import comparison, host, hostmem, models, sampling, sharding
from ibpo_jax import config as config_lib
from ibpo_jax.trainer import packing, policy, step
from ibpo_jax.trainer.state import init_state, make_optimizer

REPO = Path(__file__).resolve().parents[2]
CONFIG = f"{REPO}/configs/ibpo_gspo.py:qwen3_0.6b_math"
TOTAL_BUDGET_S = 480.0  # the watchdog's limit: 8 minutes
DELIM = 198  # "\n" in the Qwen3 vocabulary: the step delimiter of the synthetic responses


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Every size the check uses; `FULL` on an accelerator, `TINY` for the CPU test."""

    budgets: dict  # section -> seconds
    matmul: tuple[int, int]  # n, chain: `chain` dependent (n x n) @ (n x n) bf16 matmuls
    train: tuple[int, int]  # batch, sequence length
    sample: tuple[int, int, int, int]  # prompts, samples per prompt, prompt len, new tokens
    phi: tuple[int, int, int, int, int]  # groups, G, min / max units per response, LCS pairs
    repeats: int
    rl_overrides: tuple  # on top of the preset; ((key, value), ...)


_ONE_DEVICE = (("mesh.data", "1"), ("mesh.fsdp", "1"), ("mesh.tensor", "1"),
               ("train.distributed", "false"), ("reward.num_workers", "0"))
FULL = Shapes(
    budgets=dict(peak=20, train=90, sampler=100, phi=50, rl_step=200), matmul=(8192, 16),
    train=(8, 2048), sample=(16, 8, 256, 1024), phi=(16, 8, 4096, 8192, 64), repeats=5,
    rl_overrides=_ONE_DEVICE + (("rollout.prompts_per_step", "2"), ("optim.microbatches", "2"))
)
TINY = Shapes(
    budgets=dict(peak=10, train=20, sampler=20, phi=15, rl_step=40), matmul=(128, 2),
    train=(2, 32), sample=(2, 2, 8, 16), phi=(2, 8, 48, 96, 4), repeats=2,
    rl_overrides=_ONE_DEVICE + (
        ("model.preset", "tiny"), ("model.tiny.hidden_size", "64"),
        ("model.tiny.intermediate_size", "128"), ("model.tiny.num_hidden_layers", "2"),
        ("model.tiny.num_attention_heads", "4"), ("model.tiny.num_key_value_heads", "2"),
        ("model.tiny.head_dim", "16"), ("model.logits_chunk", "16"),
        ("rollout.prompts_per_step", "2"), ("rollout.max_prompt_len", "16"),
        ("rollout.max_new_tokens", "48"), ("ibpo.max_units", "32"),
        ("optim.microbatches", "2")),
)
TINY_VOCAB = 256  # the tiny preset's vocabulary (no tokenizer: ids are random)


class Report:
    """Prints one JSON line per figure, each tagged with the device and the host's CPU."""

    def __init__(self, device: jax.Device):
        self.device = {"device_kind": device.device_kind, "platform": device.platform,
                       "host_cpu": host.cpu_model()}

    def emit(self, name: str, value: float, unit: str, **extra: Any) -> None:
        """To the real stdout: sys.stdout points at stderr while the sections run."""
        print(json.dumps({"name": name, "value": float(value), "unit": unit, **self.device,
                          **extra}), file=sys.__stdout__, flush=True)


def timed(fn: Callable[[], Any], budget_s: float, repeats: int) -> tuple[float, float]:
    """(first call seconds, the best of up to `repeats` later calls): compile and warm up, then
    time until `repeats` calls or `budget_s` seconds since the start, at least one timed call."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t0
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t)
        if time.perf_counter() - t0 > budget_s:
            break
    return first, best



def matmul_params(c: models.Qwen3Config) -> int:
    """Weights that multiply activations: q/k/v/o, the MLP, and the unembedding."""
    d, f, v = c.hidden_size, c.intermediate_size, c.vocab_size
    n, k, h = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    return c.num_hidden_layers * (2 * d * n * h + 2 * d * k * h + 3 * d * f) + d * v


def attention_fwd_flops(c: models.Qwen3Config, before: np.ndarray, length: np.ndarray) -> float:
    """Forward causal-attention FLOPs of `length` queries that follow `before` earlier tokens
    (query j sees before + j keys; QK^T and AV, 2 FLOPs per multiply-add each); arrays sum."""
    before, length = np.asarray(before, np.float64), np.asarray(length, np.float64)
    pairs = length * before + length * (length + 1) / 2
    return float(4 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * pairs.sum())


FLOPS_NOTE = ("6N per trained token, 2N per forward-only token, N = matmul weights incl. the "
              "unembedding; + causal attention 4*L*heads*head_dim per (query, visible key) "
              "forward, x3 with backward; remat and padding not counted")



def run_config(tiny: bool, extra: list[tuple[str, str]]) -> config_lib.RunConfig:
    return config_lib.load(CONFIG, [*(TINY if tiny else FULL).rl_overrides, *extra])


def model_of(cfg: config_lib.RunConfig, key: jax.Array) -> models.Qwen3LM:
    """A random model as the preset builds it (no checkpoint): `policy.architecture`,
    `policy.model_options`, the preset's compute dtype."""
    arch = policy.architecture(cfg, TINY_VOCAB)
    return models.init(arch, key, dtype=jnp.dtype(cfg.model.dtype), **policy.model_options(cfg))


def section_peak(rep: Report, s: Shapes, budget: float) -> float:
    """Measured bf16 matmul FLOP/s (the MFU denominator)."""
    n, k = s.matmul
    ka, kb = jax.random.split(jax.random.key(1))
    a = jax.random.normal(ka, (n, n), jnp.bfloat16)
    b = (jax.random.normal(kb, (n, n), jnp.float32) / math.sqrt(n)).astype(jnp.bfloat16)

    @jax.jit
    def chain(x, w):  # k dependent matmuls: nothing to hoist, one dispatch
        return jax.lax.fori_loop(0, k, lambda _, y: y @ w, x)

    _, t = timed(lambda: chain(a, b), budget, s.repeats)
    rate = 2.0 * n**3 * k / t
    rep.emit("peak_matmul_bf16", rate / 1e12, "TFLOP/s", shapes={"n": n, "chain": k},
             seconds=t)
    return rate


def section_train(rep: Report, s: Shapes, budget: float, cfg, m: models.Qwen3LM,
                  peak: float) -> None:
    """LM train step (NLL of random tokens + the preset's optimizer), tokens/s and MFU."""
    (c, o), (batch, seq) = (m.config, m.options), s.train
    opt = make_optimizer(cfg.optim, total_updates=cfg.train.steps)
    tokens = jax.random.randint(jax.random.key(2), (batch, seq), 0, c.vocab_size)

    def loss_fn(params, toks):  # [B, T] -> mean NLL of tokens 1..T-1
        lp = models.token_logprobs(c, o, params, toks, logits_chunk=cfg.model.logits_chunk)
        return -jnp.mean(lp.logprobs[:, 1:])

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(params, opt_state, toks):
        loss, grads = jax.value_and_grad(loss_fn)(params, toks)
        upd, opt_state = opt.update(grads, opt_state, params)
        return jax.tree.map(jnp.add, params, upd), opt_state, loss

    state = list(init_state(jax.tree.map(jnp.copy, m.params), opt)[:2])

    def one():
        state[0], state[1], loss = train_step(state[0], state[1], tokens)
        return loss

    compile_s, t = timed(one, budget, s.repeats)
    n_tok = batch * seq
    flops = 6.0 * matmul_params(c) * n_tok + 3 * attention_fwd_flops(
        c, np.zeros(batch), np.full(batch, seq))
    shapes = {"batch": batch, "seq_len": seq, "model": _model_shape(m),
              "flops_per_step": flops, "flops_formula": FLOPS_NOTE}
    rep.emit("train_tokens_per_s", n_tok / t, "tokens/s", shapes=shapes, step_s=t,
             first_call_s=compile_s)
    rep.emit("train_mfu", flops / t / peak, "fraction of measured bf16 peak", shapes=shapes,
             peak_tflops=peak / 1e12)


def section_sampler(rep: Report, s: Shapes, budget: float, m: models.Qwen3LM) -> None:
    """Generated tokens/s of `sampling.generate_fn`, every row running all its new tokens."""
    c, (n_prompts, group, plen, new) = m.config, s.sample
    fn = sampling.generate_fn(c, m.options, max_new_tokens=new, temperature=1.0,
                              num_samples=group, eos_ids=())
    prompts = jax.random.randint(jax.random.key(3), (n_prompts, plen), 0, c.vocab_size)
    lens = jnp.full((n_prompts,), plen, jnp.int32)
    out = {}

    def one():
        out["o"] = fn(m.params, prompts, lens, jax.random.key(4))
        return out["o"].tokens

    compile_s, t = timed(one, budget, s.repeats)
    rows = n_prompts * group
    if int(jnp.min(out["o"].lengths)) != new:
        raise AssertionError("sampler: a row stopped before max_new_tokens without an EOS id")
    shapes = {"rows": rows, "prompts": n_prompts, "samples_per_prompt": group,
              "prompt_len": plen, "new_tokens": new, "model": _model_shape(m)}
    rep.emit("sampler_tokens_per_s", rows * new / t, "generated tokens/s",
             shapes=shapes, seconds=t, first_call_s=compile_s)


def section_phi(rep: Report, s: Shapes, budget: float) -> None:
    """Cells/s of φ over groups (compute_phi) and of the LCS pair kernel (lcs_first_error)."""
    groups, g, lo, hi, pairs = s.phi
    units, lengths, correct = group_units(np.random.default_rng(5), groups, g, lo, hi, 151_936)
    phi = jax.jit(jax.vmap(functools.partial(comparison.compute_phi,
                                             operator="lcs_first_error")))
    args = [jax.device_put(x) for x in (units, lengths, correct)]
    compile_s, t = timed(lambda: phi(*args).phi, budget / 2, s.repeats)
    cells = float(np.sum(np.sum(lengths.astype(np.float64), axis=1) ** 2))  # Σ_b (Σ_i n_i)²
    rep.emit("phi_cells_per_s", cells / t, "cells/s",
             shapes={"groups": groups, "group_size": g, "units_per_response": [lo, hi],
                     "cells": cells, "operator": "lcs_first_error", "cells_formula": "sum over "
                     "the G*G pairs of each group of len_i*len_j (real units, not padding)"},
             seconds=t, first_call_s=compile_s)
    full = np.full((pairs,), hi, np.int32)
    pair = jax.jit(jax.vmap(comparison.lcs_first_error))
    args = [jax.device_put(x) for x in (units[0, :1].repeat(pairs, 0),
                                        units[0, 1:2].repeat(pairs, 0), full, full)]
    compile_s, t = timed(lambda: pair(*args)[0], budget / 2, s.repeats)
    cells = float(pairs) * hi**2
    rep.emit("lcs_pair_cells_per_s", cells / t, "cells/s", seconds=t, first_call_s=compile_s,
             shapes={"pairs": pairs, "length": hi, "cells": cells})


def synthetic_rollout(cfg, vocab: int, seed: int = 6) -> tuple[step.Rollout, np.ndarray]:
    """A rollout with the config's shapes: left-padded prompts of random length, responses of
    newline-delimited steps sharing a group stem up to a random cut, random lengths (EOS-ended
    below the cap), about half correct. Returns it and prompt_len [N] (host)."""
    rng = np.random.default_rng(seed)
    b, g = cfg.rollout.prompts_per_step, cfg.rollout.group_size
    p, r, n = cfg.rollout.max_prompt_len, cfg.rollout.max_new_tokens, b * g
    plen = rng.integers(max(1, p // 2), p + 1, b).repeat(g).astype(np.int32)
    prompt = np.where(np.arange(p) >= p - plen[:, None], rng.integers(0, vocab, (n, p)), 0)
    units, rlen, correct = group_units(rng, b, g, max(1, r // 2), r, vocab)
    units = units.reshape(n, r)
    # A step ends at every token id = 0 mod 24 (~24 tokens per step): a function of the token,
    # so rows that share a stem share its steps and a wrong row's φ is above 0, as in a real
    # group.
    response = np.where(units % 24 == 0, DELIM % vocab, units)
    response = np.where(np.arange(r) < rlen.reshape(n, 1), response, 0)
    correct = correct.reshape(n)
    rollout = step.Rollout(
        prompt=prompt.astype(np.int32), prompt_len=plen, response=response.astype(np.int32),
        response_len=rlen.reshape(n), sample_logp=-rng.random((n, r)).astype(np.float32),
        reward=np.where(correct, cfg.reward.correct, cfg.reward.wrong).astype(np.float32),
        correct=correct, ended=rlen.reshape(n) < r)
    return jax.device_put(rollout), plen


def delimiter_mask(vocab: int) -> jax.Array:
    """[vocab] bool: the step delimiter of `synthetic_rollout`'s responses."""
    return jnp.zeros((vocab,), bool).at[DELIM % vocab].set(True)


def rl_flops(cfg, c: models.Qwen3Config, plen: np.ndarray, rlen: np.ndarray) -> float:
    """Model FLOPs of one step's update: a reference forward (β > 0), a π_old forward
    (several updates per rollout), and per epoch a forward + backward over every row. Prompt
    tokens count once per group in the "grouped" layout, once per row otherwise. Read from the
    config, not the step's internals (which are being refactored)."""
    heads = plen[::cfg.rollout.group_size] if cfg.optim.layout == "grouped" else plen
    fwd_tokens = float(heads.sum() + rlen.sum())
    fwd = 2.0 * matmul_params(c) * fwd_tokens + attention_fwd_flops(c, 0, heads) \
        + attention_fwd_flops(c, plen, rlen)
    single = cfg.optim.epochs * cfg.optim.minibatches == 1 and cfg.loss.name != "ppo"
    frozen = (cfg.loss.beta > 0) + (not single)
    return fwd * (frozen + 3 * cfg.optim.epochs)


def rl_once(cfg, budget: float, repeats: int) -> dict:
    """Builds and times one RL step (credit + update, jitted as the Trainer jits them) of
    `cfg` on a synthetic rollout, on the first device."""
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    with jax.set_mesh(mesh):
        m = models.init(policy.architecture(cfg, TINY_VOCAB), jax.random.key(cfg.seed),
                        dtype=jnp.dtype(cfg.model.dtype), mesh=mesh,
                        **policy.model_options(cfg))
        spec = step.StepSpec.from_config(cfg, m.config, m.options)
        updates = cfg.train.steps * cfg.optim.epochs * cfg.optim.minibatches
        optimizer = make_optimizer(cfg.optim, total_updates=updates)
        state = init_state(jax.tree.map(jnp.copy, m.params), optimizer)
        # Every leaf on the mesh and kept there by the update, as the Trainer does: the
        # compiled update accepts only the layouts it was compiled for.
        shardings = jax.tree.map(lambda x: x.sharding if isinstance(x.sharding, NamedSharding)
                                 else NamedSharding(mesh, P()), state)
        state = [jax.device_put(state, shardings)]
        rollout, plen = synthetic_rollout(cfg, m.config.vocab_size)
        is_delim = delimiter_mask(m.config.vocab_size)
        plan = packing.place(packing.identity(plen, cfg.rollout.max_prompt_len,
                                              cfg.rollout.group_size), jax.device_put)
        credit_fn = jax.jit(functools.partial(step.credit, spec))
        update_fn = jax.jit(functools.partial(step.update, spec, optimizer), donate_argnums=0,
                            out_shardings=(shardings, None))
        key, metrics = jax.random.key(7), {}
        t0 = time.perf_counter()
        cred = credit_fn(rollout, is_delim)[0]
        update_fn = update_fn.lower(state[0], m.params, rollout, cred, key, plan).compile()
        fits(update_fn, jax.devices()[0])  # fail before running out of memory on the device
        prepare_s = time.perf_counter() - t0

        def one():
            cred, metrics["credit"] = credit_fn(rollout, is_delim)
            state[0], metrics["update"] = update_fn(state[0], m.params, rollout, cred, key, plan)
            return state[0]

        first_s, t = timed(one, budget - prepare_s, repeats)
    return dict(model=m, plen=plen, rlen=np.asarray(rollout.response_len),
                compile_s=prepare_s + first_s, step_s=t,
                phi_mean=float(metrics["credit"]["phi_mean"]))


def fits(compiled: Any, device: jax.Device) -> None:
    """Raises a RESOURCE_EXHAUSTED MemoryError when XLA's buffer assignment for `compiled`
    needs more than the device has free (where the device reports its memory: GPU, TPU)."""
    stats, mem = device.memory_stats() or {}, compiled.memory_analysis()
    if "bytes_limit" not in stats or mem is None:
        return
    need = mem.temp_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
    free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    if need > free:
        raise MemoryError(f"RESOURCE_EXHAUSTED (XLA's buffer assignment): the update needs "
                          f"{need / 1e9:.1f} GB, the device has {free / 1e9:.1f} GB free")


def _out_of_memory(e: Exception) -> bool:
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def section_rl_step(rep: Report, s: Shapes, budget: float, cfg_for: Callable, peak: float
                    ) -> None:
    """One RL step of the preset; when the preset's response length runs out of device memory
    (materialized attention scores of 8 rows x 8k tokens; `fits` predicts it from the compiled
    update before running), halves it, at most twice."""
    t0, cfg, oom = time.perf_counter(), cfg_for([]), []
    for _ in range(3):
        try:
            r = rl_once(cfg, budget - (time.perf_counter() - t0), max(1, s.repeats // 2))
            break
        except Exception as e:  # noqa: BLE001 - only running out of memory is retried
            if not _out_of_memory(e) or time.perf_counter() - t0 > 0.75 * budget:
                raise
            oom.append(cfg.rollout.max_new_tokens)
            cfg = cfg_for([("rollout.max_new_tokens", str(cfg.rollout.max_new_tokens // 2))])
    else:
        raise RuntimeError(f"rl_step: out of memory at max_new_tokens {oom}")
    flops = rl_flops(cfg, r["model"].config, r["plen"], r["rlen"])
    tokens, t = int(r["plen"].sum() + r["rlen"].sum()), r["step_s"]
    shapes = {"config": CONFIG.split("/")[-1], "prompts": cfg.rollout.prompts_per_step,
              "group_size": cfg.rollout.group_size, "rows": len(r["rlen"]),
              "max_prompt_len": cfg.rollout.max_prompt_len,
              "max_new_tokens": cfg.rollout.max_new_tokens, "max_units": cfg.ibpo.max_units,
              "microbatches": cfg.optim.microbatches, "layout": cfg.optim.layout,
              "out_of_memory_at_max_new_tokens": oom, "real_tokens": tokens,
              "model": _model_shape(r["model"]), "flops_per_step": flops,
              "flops_formula": FLOPS_NOTE + "; passes: reference fwd (beta > 0), old fwd (several "
              "updates), fwd + bwd per epoch; grouped layout: prompt once per group"}
    rep.emit("rl_step_seconds", t, "s", shapes=shapes, first_call_s=r["compile_s"],
             phi_mean=r["phi_mean"])
    rep.emit("rl_step_tokens_per_s", tokens / t, "rollout tokens/s (prompt + response rows)",
             shapes=shapes)
    rep.emit("rl_step_mfu", flops / t / peak, "fraction of measured bf16 peak", shapes=shapes,
             peak_tflops=peak / 1e12)


def _model_shape(m: models.Qwen3LM) -> dict:
    c, o = m.config, m.options
    return {"layers": c.num_hidden_layers, "hidden": c.hidden_size, "mlp": c.intermediate_size,
            "heads": c.num_attention_heads, "kv_heads": c.num_key_value_heads,
            "head_dim": c.head_dim, "vocab": c.vocab_size, "matmul_params": matmul_params(c),
            "params": c.num_params(), "dtype": o.dtype.name, "param_dtype": o.param_dtype.name,
            "remat": o.remat, "scan_layers": o.scan_layers}


# ------------------------------------------------------------------------------ main

SECTIONS = ("peak", "train", "sampler", "phi", "rl_step")


def run_sections(rep: Report, s: Shapes, names: list[str], cfg_for: Callable) -> None:
    """Each section under its budget; later sections still run after one fails."""
    peak, model, cfg = None, None, cfg_for([])
    for name in names:
        t0, budget = time.perf_counter(), float(s.budgets[name])
        status, model = "ok", None if name == "rl_step" else model  # rl_step: free it first
        try:
            if name in ("train", "sampler"):
                model = model or model_of(cfg, jax.random.key(0))
            if name == "peak":
                peak = section_peak(rep, s, budget)
            elif name == "train":
                section_train(rep, s, budget, cfg, model, peak)
            elif name == "sampler":
                section_sampler(rep, s, budget, model)
            elif name == "phi":
                section_phi(rep, s, budget)
            else:
                section_rl_step(rep, s, budget, cfg_for, peak)
        except Exception as e:  # noqa: BLE001 - report the section and go on
            status = f"{type(e).__name__}: {e}"[:500]
        rep.emit(f"section_seconds_{name}", time.perf_counter() - t0, "s",
                 budget_s=budget, status=status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="CPU-sized shapes (the test)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--rl-override", action="append", default=[], metavar="KEY=VALUE",
                        help="config override for the rl_step section (repeatable)")
    parser.add_argument("--budget-scale", type=float, default=1.0,
                        help="multiply every time budget (and the watchdog's) by this")
    args = parser.parse_args(argv)
    names = args.sections.split(",")
    if bad := [n for n in names if n not in SECTIONS]:
        parser.error(f"--sections: unknown {bad}; valid: {SECTIONS}")
    if ("train" in names or "rl_step" in names) and "peak" not in names:
        names.insert(0, "peak")  # MFU needs the measured peak
    names.sort(key=SECTIONS.index)
    if bad := [o for o in args.rl_override if "=" not in o]:
        parser.error(f"--rl-override: expected KEY=VALUE, got {bad}")
    extra = [tuple(o.split("=", 1)) for o in args.rl_override]
    hostmem.reuse_freed_memory()  # as the entry points do (ibpo_jax/hostmem.py)
    if not args.budget_scale > 0:
        parser.error("--budget-scale must be > 0")
    s = TINY if args.tiny else FULL
    s = dataclasses.replace(s, budgets={k: v * args.budget_scale for k, v in s.budgets.items()})
    cfg_for = functools.partial(lambda more: run_config(args.tiny, [*extra, *more]))
    try:
        cfg_for([])
    except ValueError as e:  # config.ConfigError names the key
        parser.error(f"--rl-override: {e}")
    rep = Report(jax.devices()[0])
    t0 = time.perf_counter()
    watchdog = threading.Timer(TOTAL_BUDGET_S * args.budget_scale, _give_up, args=(rep, t0))
    watchdog.daemon = True
    watchdog.start()
    with contextlib.redirect_stdout(sys.stderr):  # libraries' prints stay off the JSON stream
        run_sections(rep, s, names, cfg_for)
    watchdog.cancel()
    rep.emit("total_seconds", time.perf_counter() - t0, "s", sections=names,
             tiny=args.tiny, jax=jax.__version__, devices=len(jax.devices()))
    return 0


def _give_up(rep: Report, t0: float) -> None:
    """The watchdog: past the total budget, say so and end the process."""
    rep.emit("total_seconds", time.perf_counter() - t0, "s", status="watchdog: stopped")
    os._exit(3)


if __name__ == "__main__":
    sys.exit(main())
