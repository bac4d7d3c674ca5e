"""experiments/benchmarks/accelerator_check.py: `--tiny --chip h100` run as a user would (a
subprocess on one CPU device) writes every figure, finite, with the MFU and bandwidth ratios
taken from the chip table and the chip marked as assumed; the FLOP and byte models against
hand counts; bad flags and an out-of-memory step fail instead of shrinking anything."""

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

from experiments import host
from ibpo_jax.runtime import chips

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "experiments" / "benchmarks" / "accelerator_check.py"
PHASES = ("sample", "reward", "phi", "score", "update")


def _load_script():
    """The script as a module (its directory on sys.path, as a script run has it)."""
    if "accelerator_check" not in sys.modules:
        sys.path.insert(0, str(SCRIPT.parent))
        spec = importlib.util.spec_from_file_location("accelerator_check", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["accelerator_check"] = module
        spec.loader.exec_module(module)
    return sys.modules["accelerator_check"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[dict, str]:
    # One plain CPU device, as on a workstation (not the suite's 8 fake devices).
    out = tmp_path_factory.mktemp("accelerator_check") / "check.json"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--chip", "h100", "--out",
                           str(out), "--time-limit", "500"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    return json.loads(out.read_text()), proc.stdout


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def test_every_figure_is_there_and_finite(run):
    d, _ = run
    assert d["status"] == "ok" and not d["errors"], d["errors"]
    rl, sampler, mm = d["rl"], d["sampler"], d["mismatch"]
    assert len(d["steps"]) == 3 and rl["steady_steps"] == [2, 3]
    for p in PHASES:
        assert _finite(rl["phases_s"][p]) and rl["phases_s"][p] > 0, p
    for key in ("mfu_step", "mfu_update", "mfu_score"):
        for f in ("flops", "seconds", "of_spec_peak", "of_measured_peak"):
            assert _finite(rl[key][f]) and rl[key][f] > 0, (key, f)
    for f in ("tokens_per_s", "achieved_bytes_per_s", "of_spec_bandwidth", "roofline_s",
              "total_bytes", "kv_bytes", "weight_bytes"):
        assert _finite(sampler[f]) and sampler[f] > 0, f
    for f in ("mean_abs", "max_abs", "ratio_mean", "ratio_std", "ratio_min", "ratio_max"):
        assert _finite(mm[f]), f
    assert mm["tokens"] == sum(d["steps"][-1]["rlen"]) > 0
    # The seeded draw (DrawnCollector) makes half of each group right: every group mixed.
    assert all(0 < s["accuracy"] < 1 and s["frac_groups_all_same"] == 0 for s in d["steps"])
    assert mm["max_abs"] >= mm["mean_abs"] >= 0 and mm["ratio_min"] <= 1 <= mm["ratio_max"] \
        or mm["max_abs"] == 0
    assert _finite(d["matmul"]["flops_per_s"]) and d["matmul"]["flops_per_s"] > 0
    # Compiles counted in step 1 (the sampler, credit, score, update), none after it.
    c = d["compile"]
    assert c["first_step"]["compiles"] >= 4 and c["first_step"]["seconds"] > 0
    # ... each in its phase: the sampler's programs under "sample", not "other".
    assert c["first_step_by_phase"]["sample"]["compiles"] >= 2, c["first_step_by_phase"]
    assert c["recompiles_after_step_1"] == 0, c["recompiled"]
    assert all(v == 1 for v in c["jit_cache_sizes"].values()), c["jit_cache_sizes"]
    # CPU has no HBM figures: said, not invented. The plan: its figures or why not.
    assert d["memory"] == {"available": False, "reason": d["memory"]["reason"]}
    assert "peak_bytes_in_use" in d["memory"]["reason"]
    plan = d["plan"]
    if plan["available"]:
        assert _finite(plan["peak_bytes_per_device"]) and _finite(plan["predicted_step_s"])
    else:
        assert plan["reason"].startswith("plan unavailable: ")


def test_ratios_come_from_the_chip_table(run):
    d, stdout = run
    h100, rl, sampler = chips.chip("h100"), d["rl"], d["sampler"]
    chip = d["meta"]["chip"]
    assert chip["name"] == "h100" and chip["source"].startswith("ASSUMED")
    assert "ASSUMED" in stdout  # the table says so too
    for key in ("mfu_step", "mfu_update"):
        x = rl[key]
        assert x["of_spec_peak"] == pytest.approx(x["flops"] / x["seconds"] / h100.bf16_flops)
        assert x["of_measured_peak"] == pytest.approx(
            x["flops"] / x["seconds"] / d["matmul"]["flops_per_s"])
    assert sampler["of_spec_bandwidth"] == pytest.approx(
        sampler["total_bytes"] / sampler["seconds"] / h100.hbm_bytes_per_s)
    assert sampler["roofline_s"] == pytest.approx(sampler["total_bytes"] / h100.hbm_bytes_per_s)
    assert d["matmul"]["of_spec_peak"] == pytest.approx(
        d["matmul"]["flops_per_s"] / h100.bf16_flops)
    # The step's FLOPs are the generation's and the update's, over the loop's phases.
    assert rl["flops"]["step"] == pytest.approx(rl["flops"]["generate"] + rl["flops"]["update"])


def test_the_run_names_itself(run):
    d, stdout = run
    m = d["meta"]
    assert m["device_kind"] == "cpu" and m["jax"] and m["cpu_model"] == host.cpu_model()
    assert m["git"]["commit"] == host.git_commit(REPO)[0]
    assert m["config"] == "configs/ibpo_gspo.py:qwen3_0.6b_math" and m["tiny"]
    s = m["shapes"]
    assert (s["group_size"], s["prompts_per_step"], s["preset_prompts_per_step"]) == (8, 2, 128)
    assert "2 of the preset's 128" in m["shapes_note"] and "| sampler |" in stdout


def test_peak_memory_and_step_beside_the_plan(run):
    """Where the device reports memory and the plan is there (a GPU run), the measured peak
    and step time stand beside the plan's; `derive` on the CPU run's steps with both given."""
    import copy
    from types import SimpleNamespace

    from ibpo_jax.trainer import policy

    check = _load_script()
    d, _ = run
    cfg = check.run_config(True, 2, [])
    model = SimpleNamespace(base=SimpleNamespace(config=policy.architecture(cfg, 256)))
    trainer = SimpleNamespace(parts=model,
                              memory={"sample": 5 * 2**30, "update": 9 * 2**30},
                              cache_sizes=lambda: {}, device=SimpleNamespace(platform="gpu"))
    out = {**copy.deepcopy(d), "errors": [], "plan": {
        "available": True, "fits": True, "peak_bytes_per_device": 8 * 2**30,
        "programs": {"update": 8 * 2**30}, "predicted_step_s": 0.5, "flops_per_step": 1e9}}
    check.derive(out, cfg, trainer, chips.chip("h100"), 1e12,
                 {"peak_bytes_in_use": 10 * 2**30, "bytes_limit": 70 * 2**30})
    mem = out["memory"]
    assert mem["available"] and mem["peak_bytes_in_use"] == 10 * 2**30
    assert mem["measured_over_plan"] == pytest.approx(10 / 8)
    assert mem["plan_programs"] == {"update": 8 * 2**30} and mem["peak_after_phase"]["update"]
    assert out["rl"]["plan"]["measured_over_predicted_step_s"] == pytest.approx(
        out["rl"]["trainer_step_s"] / 0.5)
    text = check.table(out)
    assert "| peak HBM | 10.00 GiB | plan 8 GiB |" in text and "fits: True" in text
    # No chip: no plan, said so.
    assert check.plan_figures(cfg, None)["reason"].startswith("plan unavailable: ")


def test_chip_resolution():
    check = _load_script()
    chip, how = check.resolve_chip("NVIDIA H100 80GB HBM3", None)
    assert chip.name == "h100" and "device kind" in how
    chip, how = check.resolve_chip("NVIDIA H100 80GB HBM3", "h100")
    assert chip.name == "h100" and "ASSUMED" not in how
    chip, how = check.resolve_chip("cpu", None)
    assert chip is None and "--chip" in how
    chip, how = check.resolve_chip("TPU v5 lite", "h200")
    assert chip.name == "h200" and how.startswith("ASSUMED")
    assert check.resolve_chip("NVIDIA H100 PCIe", None)[0].name == "h100-pcie"
    assert check.resolve_chip("NVIDIA H200", None)[0].hbm_bytes_per_s == 4.8e12


def test_model_flops_and_decode_bytes_by_hand():
    _load_script()
    import accelerator_check_lib as lib

    from ibpo_jax import models

    c = models.Qwen3Config(vocab_size=10, hidden_size=4, intermediate_size=6,
                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                           head_dim=2)
    # q 4x4, k 4x2, v 4x2, o 4x4, gate/up 4x6, down 6x4, unembedding 4x10
    n = 16 + 8 + 8 + 16 + 24 + 24 + 24 + 40
    assert lib.matmul_params(c) == n
    # 3 queries after 2 earlier tokens see 3, 4, 5 keys; 4 FLOPs x heads x head_dim per pair
    assert lib.attention_fwd_flops(c, np.array([2]), np.array([3])) == 4 * 2 * 2 * 12
    assert lib.attention_fwd_flops(c, np.array([0, 5]), np.array([2, 0])) == 4 * 2 * 2 * 3
    # Two rows of one group (prompt 2): one prefill of 2 tokens, then 3 + 1 generated tokens.
    plen, rlen = np.array([2, 2]), np.array([3, 1])
    assert lib.generate_flops(c, plen, rlen, group=2) == 2 * n * (2 + 4) + 4 * 2 * 2 * (
        3 + (3 + 4 + 5) + 3)
    # Decode steps: max(len) - 1 = 2 weight reads; row 0 reads 3 then 4 cached tokens, row 1
    # none (its one token came from the prefill); 2 (k, v) x 1 layer x 1 head x 2 dims x 2 B.
    b = lib.decode_bytes(c, 2, plen, rlen)
    assert b["decode_steps"] == 2 and b["weight_bytes"] == 2 * c.num_params() * 2
    assert b["kv_bytes"] == (3 + 4) * 2 * 1 * 1 * 2 * 2
    assert b["total_bytes"] == b["weight_bytes"] + b["kv_bytes"]


def test_mismatch_statistics():
    _load_script()
    import accelerator_check_lib as lib

    from ibpo_jax.trainer import step

    sample = np.log(np.array([[0.5, 0.25, 0.0], [0.5, 0.0, 0.0]], np.float32) + 1e-30)
    trainer = sample.copy()
    trainer[0, 1] += 0.1  # one token's log-prob off by 0.1; the masked ones differ wildly
    trainer[1, 1:] += 5.0
    rollout = step.Rollout(prompt=None, prompt_len=None, response=np.zeros((2, 3), np.int32),
                           response_len=np.array([2, 1]), sample_logp=sample, reward=None,
                           correct=None, ended=None)
    m = lib.mismatch(rollout, trainer)
    assert m["tokens"] == 3
    assert m["max_abs"] == pytest.approx(0.1, rel=1e-5)
    assert m["mean_abs"] == pytest.approx(0.1 / 3, rel=1e-5)
    assert m["ratio_max"] == pytest.approx(math.exp(0.1), rel=1e-5) and m["ratio_min"] == 1.0


def test_bad_arguments_name_the_flag(capsys):
    check = _load_script()
    for args, flag in ((["--steps", "2"], "--steps"), (["--chip", "b200"], "--chip"),
                       (["--override", "optim.lr"], "--override"),
                       (["--override", "optim.no_such_key=1"], "optim.no_such_key")):
        with pytest.raises(SystemExit) as e:
            check.main(["--tiny", *args])
        assert e.value.code == 2, args
        assert flag in capsys.readouterr().err, args


def test_out_of_memory_fails_without_shrinking(tmp_path, monkeypatch, capsys):
    """A step that runs out of device memory ends the run with status "failed", exit 1, the
    error kept, and the shapes as asked (no retry at smaller ones)."""
    check = _load_script()
    import accelerator_check_lib as lib

    tried = []

    def oom(self, s):
        tried.append(self.parts.cfg.rollout.max_new_tokens)
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 217GiB")

    monkeypatch.setattr(lib.BenchTrainer, "rl_step", oom)
    out = tmp_path / "x.json"
    assert check.main(["--tiny", "--chip", "h100", "--out", str(out)]) == 1
    d = json.loads(out.read_text())
    assert d["status"].startswith("failed: out of memory") and tried == [32]
    assert "RESOURCE_EXHAUSTED" in d["errors"][-1]
    assert d["meta"]["shapes"]["max_new_tokens"] == 32 and not d["steps"]
    assert "failed" in capsys.readouterr().out
