"""Float32 matmul rates of XLA:CPU and torch at the shapes the benchmark models use (no
model; a breakdown for RESULTS.md).

    python -m experiments.benchmarks.probe_matmul

Training shapes (M = 16 x 128 tokens): NN = x @ W (forward), TN = x^T @ g (weight gradient),
NT = g @ W^T (input gradient), each one jitted call, best of 5 x 20. Decode shapes (M = 64
rows): a chain through 16 different weight matrices, as the layers of a decode step read them.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

from experiments import host


def best(fn, inner: int = 20) -> float:
    fn()
    out = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        out = min(out, (time.perf_counter() - t0) / inner)
    return out


def training_shapes() -> None:
    rng = np.random.default_rng(0)
    for m, k, n in [(2048, 256, 768), (2048, 768, 256), (2048, 256, 256), (2048, 512, 1536)]:
        a, w, g = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (m, n)))
        ja, jw, jg = map(jnp.asarray, (a, w, g))
        ta, tw, tg = map(torch.from_numpy, (a, w, g))
        cases = {"NN": (jax.jit(lambda x, y: x @ y), (ja, jw), lambda: ta @ tw),
                 "TN": (jax.jit(lambda x, y: x.T @ y), (ja, jg), lambda: ta.T @ tg),
                 "NT": (jax.jit(lambda x, y: x @ y.T), (jg, jw), lambda: tg @ tw.T)}
        flops = 2 * m * k * n
        row = []
        for name, (f, args, t) in cases.items():
            tj = best(lambda f=f, args=args: f(*args).block_until_ready())
            row.append(f"{name} {flops / tj / 1e9:4.0f} / {flops / best(t) / 1e9:4.0f}")
        print(f"{m} x {k} x {n}: " + " | ".join(row) + "  (GFLOP/s jax / torch)", flush=True)


def decode_shapes(layers: int = 16) -> None:
    rng = np.random.default_rng(0)
    for m, k, n in [(64, 512, 1536), (64, 1536, 512), (64, 256, 768), (64, 768, 256)]:
        w = rng.standard_normal((layers, k, n)).astype(np.float32) * 0.01
        x = rng.standard_normal((m, k)).astype(np.float32)

        def mix(c, y, cat):  # back to [m, k] so the next matmul depends on this one
            return (c + (y[:, :k] if n >= k else cat([y] * (k // n), 1))) * 0.5

        def chain(x, w):
            return jax.lax.scan(lambda c, wi: (mix(c, c @ wi, jnp.concatenate), None), x, w)[0]

        run = jax.jit(chain)
        jx, jw = jnp.asarray(x), jnp.asarray(w)
        tx, tws = torch.from_numpy(x), [torch.from_numpy(w[i]) for i in range(layers)]

        def torch_chain():
            c = tx
            for wi in tws:
                c = mix(c, c @ wi, torch.cat)
            return c

        flops = 2 * m * k * n * layers
        tj = best(lambda: run(jx, jw).block_until_ready(), 5)
        tt = best(torch_chain, 5)
        print(f"{m} x {k} x {n} (decode chain): {flops / tj / 1e9:4.0f} / "
              f"{flops / tt / 1e9:4.0f} GFLOP/s jax / torch", flush=True)


if __name__ == "__main__":
    print(f"host: {host.cpu_model()}", flush=True)
    training_shapes()
    decode_shapes()
