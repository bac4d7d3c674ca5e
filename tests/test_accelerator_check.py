"""experiments/benchmarks/accelerator_check.py --tiny, run as a user would (a subprocess on CPU):
every figure it promises comes out as a JSON line with a finite positive value, every section
reports ok, and the model FLOPs it states agree with a hand count."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "experiments" / "benchmarks" / "accelerator_check.py"
FIGURES = {
    "peak_matmul_bf16", "train_tokens_per_s", "train_mfu", "sampler_tokens_per_s",
    "phi_cells_per_s", "lcs_pair_cells_per_s", "rl_step_seconds", "rl_step_tokens_per_s",
    "rl_step_mfu",
}
SECTIONS = ("peak", "train", "sampler", "phi", "rl_step")


def _load_script():
    """The script as a module (registered first: its dataclasses look their module up)."""
    if "accelerator_check" not in sys.modules:
        sys.path.insert(0, str(SCRIPT.parent))  # as a script run finds its sibling scripts
        spec = importlib.util.spec_from_file_location("accelerator_check", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["accelerator_check"] = module
        spec.loader.exec_module(module)
    return sys.modules["accelerator_check"]


@pytest.fixture(scope="module")
def lines() -> list[dict]:
    # One plain CPU device, as on a workstation (not the suite's 8 fake devices). Budgets x4:
    # this shared CI machine compiles slowly; the check is about the output, not the speed.
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--budget-scale", "4"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]  # every line is JSON


def test_every_figure_is_finite_and_positive(lines):
    by_name = {d["name"]: d for d in lines}
    assert FIGURES <= set(by_name), FIGURES - set(by_name)
    for name in FIGURES:
        d = by_name[name]
        assert isinstance(d["value"], float) and math.isfinite(d["value"]) and d["value"] > 0, d
        assert d["device_kind"] == "cpu" and d["unit"] and isinstance(d["shapes"], dict), d
    for name in ("train_mfu", "rl_step_mfu"):  # against a peak measured in the same run
        assert by_name[name]["peak_tflops"] == pytest.approx(
            by_name["peak_matmul_bf16"]["value"])


def test_every_section_ran_within_the_run(lines):
    by_name = {d["name"]: d for d in lines}
    for section in SECTIONS:
        d = by_name[f"section_seconds_{section}"]
        assert d["status"] == "ok", d
        assert 0 < d["value"] and math.isfinite(d["value"])
    total = by_name["total_seconds"]
    assert "status" not in total  # the watchdog did not fire
    assert total["value"] >= sum(by_name[f"section_seconds_{s}"]["value"] for s in SECTIONS)
    assert by_name["rl_step_seconds"]["shapes"]["config"].endswith("ibpo_gspo.py:qwen3_0.6b_math")


def test_synthetic_rollout_groups_share_steps():
    """The RL step's synthetic rows of one group share their stem's steps, so wrong rows get
    φ > 0 as in a real group (an H200 run once reported φ = 0 everywhere: each row's step
    delimiters were drawn on their own)."""
    check = _load_script()
    cfg = check.run_config(True, [("rollout.max_new_tokens", "256")])
    rollout, _ = check.synthetic_rollout(cfg, check.TINY_VOCAB)
    response, g = np.asarray(rollout.response), cfg.rollout.group_size
    delim = np.asarray(check.delimiter_mask(check.TINY_VOCAB))[response]
    assert 1 / 48 < delim.mean() < 1 / 12  # ~24 tokens per step

    def shared_steps(i, j):  # whole steps rows i and j have in common before they part
        differ = response[i] != response[j]
        part = int(np.argmax(differ)) if differ.any() else response.shape[1]
        return int(delim[i, :part].sum())

    assert max(shared_steps(i, j) for i in range(g) for j in range(i + 1, g)) >= 4  # 1 before
    from ibpo_jax.trainer import step as step_lib

    m = check.model_of(cfg, check.jax.random.key(0))
    spec = step_lib.StepSpec.from_config(cfg, m.config, m.options)
    _, metrics = step_lib.credit(spec, rollout, check.delimiter_mask(check.TINY_VOCAB))
    assert float(metrics["phi_mean"]) > 0.3, metrics["phi_mean"]  # 0.06 before the fix
    assert np.asarray(rollout.correct).reshape(-1, g).any(axis=1).all()  # φ needs a right row


def test_model_flops_by_hand():
    """matmul_params and attention_fwd_flops against a hand count of a 1-layer model."""
    check = _load_script()
    from ibpo_jax import models

    c = models.Qwen3Config(vocab_size=10, hidden_size=4, intermediate_size=6,
                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                           head_dim=2)
    # q 4x4, k 4x2, v 4x2, o 4x4, gate/up 4x6, down 6x4, unembedding 4x10
    assert check.matmul_params(c) == 16 + 8 + 8 + 16 + 24 + 24 + 24 + 40
    # 3 queries after 2 earlier tokens see 3, 4, 5 keys; 4 FLOPs x heads x head_dim per pair
    assert check.attention_fwd_flops(c, np.array([2]), np.array([3])) == 4 * 2 * 2 * 12
    # two rows sum; a row of length 0 costs nothing
    assert check.attention_fwd_flops(c, np.array([0, 5]), np.array([2, 0])) == 4 * 2 * 2 * 3


def test_bad_arguments_name_the_flag():
    """Bad flags fail at once (exit 2, argparse) and name the flag or config key."""
    for args, flag in ((["--sections", "peak,nope"], "--sections"),
                       (["--rl-override", "optim.lr"], "--rl-override"),
                       (["--rl-override", "optim.no_such_key=1"], "optim.no_such_key"),
                       (["--budget-scale", "0"], "--budget-scale")):
        proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", *args],
                              capture_output=True, text=True, timeout=120, cwd=REPO,
                              env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""})
        assert proc.returncode == 2 and flag in proc.stderr, (args, proc.stderr[-500:])


def test_rl_step_halves_the_response_length_when_out_of_memory(monkeypatch):
    """An out-of-memory RL step is retried at half the new tokens and the lines say so; other
    errors are not retried."""
    import jax.numpy as jnp

    from ibpo_jax import models

    check = _load_script()
    tried, lines = [], []

    def fake_rl_once(cfg, budget, repeats):
        tried.append(cfg.rollout.max_new_tokens)
        if cfg.rollout.max_new_tokens > 12:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")
        c = models.Qwen3Config(vocab_size=16, hidden_size=8, intermediate_size=8,
                               num_hidden_layers=1, num_attention_heads=2,
                               num_key_value_heads=1, head_dim=4)
        model = models.Qwen3LM(c, models.make_options(jnp.bfloat16), {})
        return dict(model=model, plen=np.full(16, 4), rlen=np.full(16, 12), compile_s=1.0,
                    step_s=0.5, phi_mean=0.25)

    class Capture(check.Report):
        def emit(self, name, value, unit, **extra):
            lines.append({"name": name, "value": value, **extra})

    monkeypatch.setattr(check, "rl_once", fake_rl_once)
    cfg_for = lambda more: check.run_config(True, more)  # noqa: E731 - tiny: 48 new tokens
    rep = Capture.__new__(Capture)
    check.section_rl_step(rep, check.TINY, 100.0, cfg_for, 1e9)
    assert tried == [48, 24, 12]
    by_name = {d["name"]: d for d in lines}
    shapes = by_name["rl_step_seconds"]["shapes"]
    assert shapes["max_new_tokens"] == 12 and shapes["out_of_memory_at_max_new_tokens"] == [48, 24]
    assert by_name["rl_step_tokens_per_s"]["value"] == (16 * 4 + 16 * 12) / 0.5

    def broken(cfg, budget, repeats):
        tried.append(cfg.rollout.max_new_tokens)
        raise TypeError("an API change")

    monkeypatch.setattr(check, "rl_once", broken)
    tried.clear()
    with pytest.raises(TypeError, match="an API change"):
        check.section_rl_step(rep, check.TINY, 100.0, cfg_for, 1e9)
    assert tried == [48]


def test_fits_predicts_out_of_memory_from_the_buffer_assignment():
    """`fits` compares XLA's temp + output (less aliased) bytes with the device's free bytes,
    and stays silent where the device reports no memory (CPU)."""
    from types import SimpleNamespace

    check = _load_script()
    compiled = SimpleNamespace(memory_analysis=lambda: SimpleNamespace(
        temp_size_in_bytes=60e9, output_size_in_bytes=10e9, alias_size_in_bytes=8e9))
    gpu = lambda in_use: SimpleNamespace(  # noqa: E731
        memory_stats=lambda: {"bytes_limit": 80e9, "bytes_in_use": in_use})
    check.fits(compiled, gpu(10e9))  # needs 62 GB, 70 GB free
    with pytest.raises(MemoryError, match="RESOURCE_EXHAUSTED.*62.0 GB.*60.0 GB free"):
        check.fits(compiled, gpu(20e9))
    check.fits(compiled, SimpleNamespace(memory_stats=lambda: None))
    assert check._out_of_memory(MemoryError("RESOURCE_EXHAUSTED (XLA's buffer assignment)"))
