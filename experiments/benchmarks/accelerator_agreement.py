"""Correctness on the card (issue 61, item 1): the attention kernels agree, and greedy decoding
equals its one-pass reference.

    python experiments/benchmarks/accelerator_agreement.py [--tiny] [--out X.json]

- **attention**: every kernel the platform runs (dense and chunked everywhere, cuDNN on a GPU,
  splash on a TPU) against dense attention in float32, on the masks the model builds (causal,
  left padding, packed rows with a padding gap, grouped prompt + response): values and the
  gradients of a random projection of the output with respect to q, k and v, in float32 and
  bfloat16. The figure is the largest |difference| over the reference's largest |value|; it
  passes under `TOLERANCE[dtype]` (bf16 carries 8 bits of mantissa; float32 on a GPU may run
  its dots in TF32, 10 bits).
- **greedy**: a random Qwen3 of `qwen3-0.6b`'s architecture (`--tiny`: a small one) in bf16
  compute, f32 weights, decodes `--new-tokens` greedily (`sampling.generate_fn`, the trainer's
  sampler); one forward pass over prompt + response recomputes every position's logits. A
  token must be the argmax of its recomputed logits wherever the top two are further apart than
  `TIE` (bf16 rounding can swap a near tie between the two passes): the count of such clear
  disagreements must be 0, and the near ties are reported.

Exit 0 when every check passes, 1 otherwise; a JSON with every figure at --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from ibpo_jax import models  # noqa: E402
from ibpo_jax.models import attention  # noqa: E402
from ibpo_jax.sampler import sampling  # noqa: E402

TOLERANCE = {"float32": 2e-3, "bfloat16": 4e-2}  # max |diff| / max |reference|
TIE = 0.05  # logits this close may swap between the sampler and the forward pass in bf16


def platform_kernels(platform: str) -> tuple[str, ...]:
    """The attention kernels `platform` runs natively."""
    return ("dense", "chunked") + {"gpu": ("cudnn",), "tpu": ("splash",)}.get(platform, ())


def masks(b: int, t: int) -> dict[str, tuple[attention.Mask, int, int]]:
    """name -> (Mask, T queries, S keys): the masks the model builds, at length `t`."""
    idx = np.arange(t)[None]
    left = jnp.asarray(idx >= t - np.array([[t], [t // 3]][:b]))
    packed = np.zeros((b, t), np.int32)
    packed[:, : t // 3], packed[:, t // 3: t // 2] = 1, 2  # two sequences, a gap, a third
    packed[:, 2 * t // 3:] = 3
    p = t // 4
    prompt = jnp.asarray(np.arange(p)[None] >= p - np.array([[p], [p // 2]][:b]))
    return {"causal": (attention.causal_mask(jnp.ones((b, t), bool)), t, t),
            "left_padding": (attention.causal_mask(left), t, t),
            "packed": (attention.causal_mask(jnp.asarray(packed > 0), jnp.asarray(packed)), t, t),
            "grouped": (attention.grouped_mask(prompt, 1, t // 2), t // 2, p + t // 2)}


def _value_and_grads(impl: str, q, k, v, w, mask) -> tuple[Any, ...]:
    block = max(16, q.shape[3] // 4)  # chunked over several tiles (whole rows: one tile)
    fn = lambda q, k, v: attention.self_attention(  # noqa: E731
        q, k, v, mask, impl, block_q=block, block_kv=block)
    out = jax.jit(fn)(q, k, v)
    loss = lambda q, k, v: jnp.sum(w * fn(q, k, v).astype(jnp.float32))  # noqa: E731
    return (out, *jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v))


def attention_agreement(kernels: tuple[str, ...], *, b: int, kv: int, g: int, t: int, h: int
                        ) -> list[dict]:
    """One row per (kernel, dtype, mask): the worst relative difference of values and q/k/v
    gradients against float32 dense attention, and whether it is within TOLERANCE."""
    rows = []
    for name, (mask, tq, s) in masks(b, t).items():
        rng = np.random.default_rng(0)
        q, w = (rng.standard_normal((b, kv, g, tq, h)).astype(np.float32) for _ in range(2))
        k, v = (rng.standard_normal((b, kv, s, h)).astype(np.float32) for _ in range(2))
        ref = [np.asarray(x, np.float32) for x in _value_and_grads("dense", q, k, v, w, mask)]
        for dtype in ("float32", "bfloat16"):
            cast = [jnp.asarray(x, dtype) for x in (q, k, v)]
            for impl in kernels:
                got = _value_and_grads(impl, *cast, jnp.asarray(w), mask)
                errs = [float(np.max(np.abs(np.asarray(a, np.float32) - r)) /
                              max(float(np.max(np.abs(r))), 1e-30)) for a, r in zip(got, ref)]
                rows.append({"kernel": impl, "dtype": dtype, "mask": name,
                             "value": errs[0], "grad_q": errs[1], "grad_k": errs[2],
                             "grad_v": errs[3], "finite": bool(all(
                                 np.isfinite(np.asarray(a, np.float32)).all() for a in got)),
                             "ok": bool(max(errs) <= TOLERANCE[dtype])})
    return rows


def greedy_agreement(tiny: bool, rows: int, prompt_len: int, new_tokens: int) -> dict:
    """The sampler's greedy tokens against the argmax of a forward pass over prompt + response
    (module docstring)."""
    if tiny:
        config = models.Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=16,
                                    max_position_embeddings=prompt_len + new_tokens)
    else:
        config = models.QWEN3_PRESETS["qwen3-0.6b"]
    m = models.init(config, jax.random.key(0), dtype=jnp.bfloat16, param_dtype=jnp.float32,
                    scan_layers=True)
    rng = np.random.default_rng(0)
    lens = rng.integers(prompt_len // 2, prompt_len + 1, rows)
    lens[0] = prompt_len
    prompts = rng.integers(0, config.vocab_size, (rows, prompt_len))
    prompts = np.where(np.arange(prompt_len)[None] >= prompt_len - lens[:, None], prompts, 0)
    fn = sampling.generate_fn(m.config, m.options, max_new_tokens=new_tokens, temperature=0.0)
    start = time.perf_counter()
    out = fn(m.params, prompts, lens, jax.random.key(1))
    tokens = np.asarray(out.tokens)
    seconds = time.perf_counter() - start
    full = np.concatenate([prompts, tokens], 1)
    valid = np.concatenate([np.arange(prompt_len)[None] >= prompt_len - lens[:, None],
                            np.arange(new_tokens)[None] < np.asarray(out.lengths)[:, None]], 1)
    logits = np.asarray(jax.jit(models.forward, static_argnums=(0, 1))(
        m.config, m.options, m.params, jnp.asarray(full), jnp.asarray(valid)), np.float32)
    # position prompt_len - 1 + j predicts response token j
    pred = logits[:, prompt_len - 1: prompt_len - 1 + new_tokens]
    top2 = np.sort(pred, -1)[..., -2:]
    gap = top2[..., 1] - top2[..., 0]
    live = np.arange(new_tokens)[None] < np.asarray(out.lengths)[:, None]
    differ = (pred.argmax(-1) != tokens) & live
    return {"architecture": "tiny" if tiny else "qwen3-0.6b", "rows": rows,
            "prompt_len": prompt_len, "new_tokens": new_tokens, "seconds": seconds,
            "positions": int(live.sum()), "rows_identical": int((~differ.any(1)).sum()),
            "clear_disagreements": int((differ & (gap > TIE)).sum()),
            "near_ties_swapped": int((differ & (gap <= TIE)).sum()),
            "ok": bool(not (differ & (gap > TIE)).any())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="CPU-sized shapes (the tests)")
    p.add_argument("--out", default="", help="write every figure here as JSON")
    p.add_argument("--new-tokens", type=int, default=0, help="greedy tokens per row")
    args = p.parse_args(argv)
    platform = jax.devices()[0].platform
    kernels = platform_kernels(platform)
    # Qwen3-0.6B's attention: 8 KV heads of 128, 2 query heads each; 1,024-token rows.
    sizes = (dict(b=2, kv=2, g=2, t=48, h=16) if args.tiny else
             dict(b=2, kv=8, g=2, t=1024, h=128))
    out = {"device": jax.devices()[0].device_kind, "platform": platform, "jax": jax.__version__,
           "tolerance": TOLERANCE, "tie": TIE,
           "attention": attention_agreement(kernels, **sizes),
           "greedy": greedy_agreement(args.tiny, 4 if args.tiny else 64,
                                      16 if args.tiny else 256,
                                      args.new_tokens or (24 if args.tiny else 512))}
    print(f"device: {out['device']} ({platform}), jax {jax.__version__}")
    print("| kernel | dtype | mask | value | grad q | grad k | grad v | ok |")
    print("|---|---|---|---|---|---|---|---|")
    for r in out["attention"]:
        print(f"| {r['kernel']} | {r['dtype']} | {r['mask']} | {r['value']:.1e} | "
              f"{r['grad_q']:.1e} | {r['grad_k']:.1e} | {r['grad_v']:.1e} | "
              f"{'yes' if r['ok'] and r['finite'] else 'NO'} |")
    g = out["greedy"]
    print(f"greedy ({g['architecture']}, {g['rows']} rows, {g['new_tokens']} new tokens, "
          f"{g['seconds']:.1f} s): {g['rows_identical']}/{g['rows']} rows identical to the "
          f"one-pass argmax; {g['clear_disagreements']} clear disagreements, "
          f"{g['near_ties_swapped']} near ties swapped -> {'ok' if g['ok'] else 'FAIL'}")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    passed = g["ok"] and all(r["ok"] and r["finite"] for r in out["attention"])
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
