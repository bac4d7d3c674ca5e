"""Qwen3 in ibpo_jax vs HF transformers (torch), same random weights, same CPU, one process.

For each model size it prints one JSON line with
- train step (forward + backward + AdamW, batch 16 x 128, next-token cross-entropy) tokens/s of
  both, ours / HF, and both model-FLOPs utilisations against a float32 2048^3 matmul measured in
  the same run (jax and torch each against their own matmul and against the faster of the two);
- sampling with KV cache (64 prompts of 32 tokens, 64 new tokens, every row runs full length,
  temperature 1, no top-k/top-p) generated tokens/s of both, ours / HF, and the bound that our
  decode's matmuls alone put on that ratio (those matmuls timed by themselves, same weights);
- a decode-step breakdown: ms per step of ours, of HF, of our matmuls alone and of our decode
  attention alone (all layers);
- compile times of our jitted train step and sampler (prefill + decode segments);
- the max |logits difference| between the two models on the benchmark batch (sanity).

Timings alternate HF and ours trial by trial and keep the best trial of each (the machine may
be shared). Model FLOPs per trained token: 6 * (matmul weights incl. unembedding) +
6 * L * T * N * H (causal attention scores and values, forward + backward).

    python -m experiments.benchmarks.bench_model [--sizes tiny,larger] [--trials 5]
        [--attention auto|dense|chunked|...]   (ModelOptions.attention of our model)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import transformers

from experiments import host
from ibpo_jax import models
from ibpo_jax.models import attention, kv_cache
from ibpo_jax.runtime import hostmem
from ibpo_jax.sampler import sampling

SIZES = {
    # vocab 64, hidden 256, 4 layers, 8 heads, 4 kv heads, head_dim 32; MLP 3x hidden
    "tiny": dict(vocab_size=64, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=4, head_dim=32),
    # vocab 4096, hidden 512, 8 layers; 8 heads, 4 kv heads, head_dim 64, MLP 3x hidden
    "larger": dict(vocab_size=4096, hidden_size=512, intermediate_size=1536,
                   num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                   head_dim=64),
}
TRAIN_B, TRAIN_T = 16, 128
SAMPLE_B, SAMPLE_P, SAMPLE_N = 64, 32, 64
LR = 1e-4


def best_time(fn, trials: int, inner: int) -> float:
    best = float("inf")
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def matmul_gflops(n: int = 2048) -> dict[str, float]:
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    ja = jnp.asarray(a)
    mm = jax.jit(lambda x: x @ x)
    mm(ja).block_until_ready()
    ta = torch.from_numpy(a)
    torch.matmul(ta, ta)
    t_jax = best_time(lambda: mm(ja).block_until_ready(), 5, 5)
    t_torch = best_time(lambda: torch.matmul(ta, ta), 5, 5)
    return {"jax": 2 * n**3 / t_jax / 1e9, "torch": 2 * n**3 / t_torch / 1e9}


def train_flops_per_token(cfg: dict) -> float:
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    n, k, h, L = (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
                  cfg["num_hidden_layers"])
    matmul_params = L * (2 * d * n * h + 2 * d * k * h + 3 * d * f) + d * v
    return 6 * matmul_params + 6 * L * TRAIN_T * n * h


def decode_matmul_floor(m: models.Qwen3LM, rows: int, steps: int, trials: int) -> float:
    """Seconds for the matmuls alone of `steps` decode steps at `rows` rows (every layer's
    q/k/v/o and MLP projections and the unembedding, as 2-D matmuls on the model's own
    weights, chained so that nothing is hoisted): a lower bound on our sampler's time."""
    c, p = m.config, m.params
    layers = [p[f"layers_{i}"] for i in range(c.num_hidden_layers)]
    unembed = p["embedding"].T if c.tie_word_embeddings else p["lm_head"]
    d = c.hidden_size

    def step(x, _):
        for lp in layers:
            a, mlp = lp["attn"], lp["mlp"]
            qkv = [x @ a[k].reshape(d, -1) for k in ("q_proj", "k_proj", "v_proj")]
            x = x + qkv[0] @ a["o_proj"].reshape(-1, d) + 0 * (qkv[1].sum() + qkv[2].sum())
            x = x + (x @ mlp["gate_proj"]) * (x @ mlp["up_proj"]) @ mlp["down_proj"]
            x = x * 1e-3  # keep values bounded over the steps
        return x + 0 * jnp.sum(x @ unembed), None

    run = jax.jit(lambda x: jax.lax.scan(step, x, None, length=steps)[0])
    x = jnp.ones((rows, d), jnp.float32)
    run(x).block_until_ready()
    return best_time(lambda: run(x).block_until_ready(), trials, 1)


def decode_attention_time(c: models.Qwen3Config, rows: int, prompt_len: int, steps: int,
                          trials: int) -> float:
    """Seconds of decode attention alone over `steps` steps of `rows` rows and every layer:
    `attention.decode_attention` timed at each row-cache width of the sampler's segments
    (`kv_cache.slot_widths`), weighted by the steps run at that width."""
    rng = np.random.default_rng(1)
    kk, g, h = c.num_key_value_heads, c.num_groups, c.head_dim
    arr = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
    q, pk, pv = arr(rows, kk, g, h), arr(rows, kk, h, prompt_len), arr(rows, kk, prompt_len, h)
    prompt_mask = jnp.ones((rows, prompt_len), bool)
    total, start = 0.0, 0
    for width in kv_cache.slot_widths(steps):
        gk, gv = arr(rows, kk, h, width), arr(rows, kk, width, h)
        slot_mask = jnp.arange(width) <= start
        run = jax.jit(lambda *a, m=slot_mask: attention.decode_attention(*a, prompt_mask, m))
        run(q, pk, pv, gk, gv).block_until_ready()
        per_call = best_time(lambda: run(q, pk, pv, gk, gv).block_until_ready(), trials, 10) / 10
        total += per_call * (min(width, steps) - start) * c.num_hidden_layers
        start = width
    return total


def bench_size(name: str, trials: int, peak: dict[str, float], attention_impl: str) -> dict:
    cfg = SIZES[name]
    hf, m = _models(cfg, attention_impl)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg["vocab_size"], (TRAIN_B, TRAIN_T))
    with torch.no_grad():
        ref = hf(torch.from_numpy(tokens)).logits.numpy()
    logits_diff = float(np.abs(np.asarray(m(tokens)) - ref).max())
    t_hf, t_jax, train_compile = _bench_train(hf, m, tokens, trials)
    train_tokens = TRAIN_B * TRAIN_T
    flops = train_flops_per_token(cfg) * train_tokens
    best_peak = max(peak.values())
    prompts = rng.integers(0, cfg["vocab_size"], (SAMPLE_B, SAMPLE_P))
    s_hf, s_jax, sample_compile = _bench_sample(hf, m, prompts, trials)
    gen_tokens = SAMPLE_B * SAMPLE_N
    steps = SAMPLE_N - 1
    floor = decode_matmul_floor(m, SAMPLE_B, steps, trials)
    attn = decode_attention_time(m.config, SAMPLE_B, SAMPLE_P, steps, trials)
    return {
        "size": name, **cfg, "attention": attention_impl,
        "logits_max_abs_diff": logits_diff,
        "train_tok_s_hf": train_tokens / t_hf, "train_tok_s_ours": train_tokens / t_jax,
        "train_ratio": t_hf / t_jax,
        "train_mfu_ours": flops / t_jax / 1e9 / peak["jax"],
        "train_mfu_hf": flops / t_hf / 1e9 / peak["torch"],
        "train_mfu_ours_vs_best_matmul": flops / t_jax / 1e9 / best_peak,
        "train_mfu_hf_vs_best_matmul": flops / t_hf / 1e9 / best_peak,
        "sample_tok_s_hf": gen_tokens / s_hf, "sample_tok_s_ours": gen_tokens / s_jax,
        "sample_ratio": s_hf / s_jax,
        # Our decode's matmuls alone: no sampler of ours can beat this rate on this machine.
        "sample_tok_s_matmul_floor": gen_tokens / floor,
        "sample_ratio_bound_by_matmuls": s_hf / floor,
        # Decode-step breakdown (ms per step): ours, its matmuls alone, its decode attention
        # alone (every layer, the row cache at the widths the sampler's segments use).
        "decode_ms_per_step_ours": s_jax / steps * 1e3,
        "decode_ms_per_step_matmuls": floor / steps * 1e3,
        "decode_ms_per_step_attention": attn / steps * 1e3,
        "decode_ms_per_step_hf": s_hf / steps * 1e3,
        "compile_s_train_step": train_compile, "compile_s_sampler": sample_compile,
    }


def _models(cfg: dict, attention_impl: str):
    """A random HF Qwen3 (torch seed 0) and ours loaded from its safetensors."""
    torch.manual_seed(0)
    hf_cfg = transformers.Qwen3Config(**cfg, rope_theta=1e6, tie_word_embeddings=False,
                                      max_position_embeddings=512)
    hf = transformers.Qwen3ForCausalLM(hf_cfg)
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        m = models.load_hf(tmp, attention=attention_impl)
    return hf, m


def _bench_train(hf, m, tokens: np.ndarray, trials: int) -> tuple[float, float, float]:
    """(HF's best train-step seconds, ours, our step's compile seconds) on `tokens` [B, T]."""
    hf.train()
    opt_t = torch.optim.AdamW(hf.parameters(), lr=LR)
    t_tokens = torch.from_numpy(tokens)

    def hf_step():
        loss = hf(t_tokens, labels=t_tokens).loss
        loss.backward()
        opt_t.step()
        opt_t.zero_grad(set_to_none=True)

    hf_step()
    opt = optax.adamw(LR, weight_decay=0.01)

    def loss_fn(params, toks):
        lp = models.token_logprobs(m.config, m.options, params, toks).logprobs
        return -jnp.sum(lp[:, 1:]) / (toks.shape[0] * (toks.shape[1] - 1))

    def step(params, opt_state, toks):
        loss, grads = jax.value_and_grad(loss_fn)(params, toks)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    j_tokens = jnp.asarray(tokens, jnp.int32)
    params0 = jax.tree.map(jnp.copy, m.params)  # the step donates its params
    state = {"params": params0, "opt": opt.init(params0)}
    t0 = time.perf_counter()
    step_c = jax.jit(step, donate_argnums=(0, 1)).lower(state["params"], state["opt"],
                                                        j_tokens).compile()
    train_compile = time.perf_counter() - t0

    def jax_step():
        state["params"], state["opt"], loss = step_c(state["params"], state["opt"], j_tokens)
        loss.block_until_ready()

    jax_step()
    t_hf = t_jax = float("inf")
    for _ in range(trials):
        t_hf = min(t_hf, best_time(hf_step, 1, 3))
        t_jax = min(t_jax, best_time(jax_step, 1, 3))
    return t_hf, t_jax, train_compile


def _bench_sample(hf, m, prompts: np.ndarray, trials: int) -> tuple[float, float, float]:
    """(HF's best generate seconds, ours, our sampler's compile seconds) for `prompts`
    [SAMPLE_B, SAMPLE_P], SAMPLE_N new tokens each."""
    hf.eval()
    lens = np.full((SAMPLE_B,), SAMPLE_P)
    t_prompts = torch.from_numpy(prompts)

    def hf_generate():
        with torch.no_grad():
            out = hf.generate(t_prompts, attention_mask=torch.ones_like(t_prompts),
                              do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                              max_new_tokens=SAMPLE_N, min_new_tokens=SAMPLE_N,
                              eos_token_id=None, pad_token_id=0)
        assert out.shape == (SAMPLE_B, SAMPLE_P + SAMPLE_N)

    hf_generate()
    fn = sampling.generate_fn(m.config, m.options, max_new_tokens=SAMPLE_N, temperature=1.0)
    j_prompts, j_lens = jnp.asarray(prompts, jnp.int32), jnp.asarray(lens, jnp.int32)
    key = jax.random.key(0)

    def jax_generate():
        final = fn(m.params, j_prompts, j_lens, key)
        final.tokens.block_until_ready()
        assert int(final.lengths.min()) == SAMPLE_N

    # Compile time: the first call (prefill + one program per decode segment) minus a call.
    t0 = time.perf_counter()
    jax_generate()
    first_call = time.perf_counter() - t0
    sample_compile = first_call - best_time(jax_generate, 1, 1)
    s_hf = s_jax = float("inf")
    for _ in range(trials):
        s_hf = min(s_hf, best_time(hf_generate, 1, 1))
        s_jax = min(s_jax, best_time(jax_generate, 1, 2))
    return s_hf, s_jax, sample_compile


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="tiny,larger")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--attention", default="auto", choices=attention.IMPLEMENTATIONS,
                        help="our model's attention kernel (ModelOptions.attention)")
    args = parser.parse_args()
    hostmem.reuse_freed_memory()  # as the entry points do (ibpo_jax/runtime/hostmem.py)
    peak = matmul_gflops()
    env = {"jax": jax.__version__, "torch": torch.__version__,
           "transformers": transformers.__version__, "cpu": host.cpu_model(),
           "cpus": os.cpu_count(),
           "torch_threads": torch.get_num_threads(), "matmul_gflops_2048": peak,
           "loadavg_1m_at_start": os.getloadavg()[0]}  # > ~0.5 on 2 cores: shared, noisy
    for name in args.sizes.split(","):
        print(json.dumps({**env, **bench_size(name, args.trials, peak, args.attention)}),
              flush=True)


if __name__ == "__main__":
    main()
