"""experiments/benchmarks/accelerator_agreement.py (issue 61 item 1) at CPU sizes: run as a
user would, every kernel the CPU runs agrees with float32 dense attention and greedy decoding
with its one-pass reference; a kernel that is off, and a sampler that is, are caught."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "experiments" / "benchmarks" / "accelerator_agreement.py"


def _module():
    spec = importlib.util.spec_from_file_location("accelerator_agreement", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tiny_run_passes_and_writes_every_figure(tmp_path):
    out = tmp_path / "agree.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", f"--out={out}"],
                          env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    got = json.loads(out.read_text())
    rows = got["attention"]
    assert {(r["kernel"], r["dtype"]) for r in rows} == {
        (k, d) for k in ("dense", "chunked") for d in ("float32", "bfloat16")}
    assert {r["mask"] for r in rows} == {"causal", "left_padding", "packed", "grouped"}
    for r in rows:
        assert r["ok"] and r["finite"]
        if r["dtype"] == "float32":
            assert max(r["value"], r["grad_q"], r["grad_k"], r["grad_v"]) < 1e-5
        else:  # bf16 inputs: rounding, and not nothing
            assert 1e-4 < r["value"] < 4e-2
    g = got["greedy"]
    assert g["ok"] and g["clear_disagreements"] == 0 and g["positions"] > 0
    assert "| chunked | bfloat16 | packed |" in proc.stdout


def test_a_kernel_that_is_off_fails(monkeypatch):
    m = _module()
    real = m.attention.self_attention

    def off(q, k, v, mask, impl, **kw):
        out = real(q, k, v, mask, impl, **kw)
        return out * jnp.asarray(1.01, out.dtype) if impl == "chunked" else out

    monkeypatch.setattr(m.attention, "self_attention", off)
    rows = m.attention_agreement(("dense", "chunked"), b=2, kv=1, g=2, t=16, h=8)
    assert all(r["ok"] for r in rows if r["kernel"] == "dense")
    assert not any(r["ok"] for r in rows if r["kernel"] == "chunked" and r["dtype"] == "float32")


def test_a_sampler_that_is_off_fails(monkeypatch):
    """Greedy tokens shifted by one id disagree with the argmax at clear margins."""
    m = _module()
    real = m.sampling.generate_fn

    def shifted(*args, **kwargs):
        fn = real(*args, **kwargs)

        def run(params, prompts, lens, rng):
            out = fn(params, prompts, lens, rng)
            return out._replace(tokens=(out.tokens + 1) % 512)
        return run

    monkeypatch.setattr(m.sampling, "generate_fn", shifted)
    g = m.greedy_agreement(True, 2, 8, 8)
    assert not g["ok"] and g["clear_disagreements"] > 0
