"""`python -m ibpo_jax.plan`: the qwen3 presets fit the hardware they name, memory grows
linearly with the response length, and `optim.microbatches="auto"`.

The plans run as users run them (`python -m ibpo_jax.plan ... --json`), each in its own process
with its own simulated device count, three at a time (each compiles one program for minutes of
one core). They compile the presets at full size (every layer, full widths and vocabulary:
with scanned layers the compile time does not depend on the depth, so nothing is cut) but only
the update, the largest program of 0.6B and the largest but decode of 8B (docs/plan.md has
the full plans). Runtime: 81 s for the file on 2 cores alone (8.6 min when the cores were
shared with another plan).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from ibpo_jax import config
from ibpo_jax.plan import flops

ROOT = Path(__file__).resolve().parents[2]
GIB = 2 ** 30


def _start(preset: str, hardware: str, devices: int, *overrides: str) -> subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}  # the plan sets its devices
    return subprocess.Popen(
        [sys.executable, "-m", "ibpo_jax.plan", f"--config=configs/ibpo_gspo.py:{preset}",
         f"--hardware={hardware}", f"--devices={devices}", "--json", "--only=update",
         *overrides], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def _result(proc: subprocess.Popen) -> tuple[int, dict, str]:
    out, err = proc.communicate(timeout=900)
    return proc.returncode, (json.loads(out) if out.strip() else {}), err


@pytest.fixture(scope="module")
def plans():
    """{name: (exit status, plan, stderr)}, the three plans run side by side."""
    procs = {
        "0.6b": _start("qwen3_0.6b_math", "h100", 1),
        "0.6b_2048": _start("qwen3_0.6b_math", "h100", 1, "--config.rollout.max_new_tokens=2048"),
        "8b": _start("qwen3_8b_math", "h100", 8),
        "8b_lora": _start("qwen3_8b_math", "h100", 8, "--config.model.lora.rank=64"),
    }
    return {name: _result(p) for name, p in procs.items()}


@pytest.mark.parametrize("name, devices", [("0.6b", 1), ("8b", 8)])
def test_preset_update_fits_its_hardware(plans, name, devices):
    rc, plan, err = plans[name]
    assert plan, err[-2000:]
    assert plan["devices"] == devices and plan["hardware"] == "h100"
    assert plan["hbm_bytes_per_device"] == int(80 * GIB * 0.95)
    update = plan["programs"]["update"]
    assert 0 < update <= plan["hbm_bytes_per_device"], f"{update / GIB:.1f} GiB"
    assert plan["fits"] and rc == 0, err[-2000:]
    assert plan["flops_per_step"] > 0 and plan["predicted_step_s"] > 0


def test_lora_lowers_the_resident_state_and_the_update(plans):
    """LoRA: the state is the adapters (fp32) and their Adam moments, the frozen base is held
    once (as π_ref, in the param dtype) and no reference copy is kept."""
    full, (rc, lora, err) = plans["8b"][1], plans["8b_lora"]
    assert lora and rc == 0, err[-2000:]
    rf, rl = full["resident_bytes_per_device"], lora["resident_bytes_per_device"]
    assert rl["reference"] == rf["params"]  # the fp32 base itself, sharded alike
    # rank 64 on all 7 projections of 36 layers: 64 (I + O) each, 4 bytes, over 8 devices
    c = config.load("configs/ibpo_gspo.py:qwen3_8b_math")
    per_layer = 64 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 12288))
    assert rl["params"] == 36 * per_layer * 4 // 8 and c.model.lora.rank == 0
    assert 0 <= rl["adam"] - 2 * rl["params"] < 64  # two moments, plus Adam's step counters
    resident = lambda r: r["params"] + r["adam"] + r["reference"]  # noqa: E731
    assert resident(rl) < 0.45 * resident(rf)  # full: fp32 params + 2 moments + bf16 copy
    assert lora["programs"]["update"] < full["programs"]["update"]


def test_update_memory_linear_in_response_length(plans):
    """Linear-memory attention and chunked logits: 4x the new tokens (2,048 -> 8,192, rows of
    3,072 -> 9,216 positions) may cost at most 4.5x the update's peak (materialized scores
    would cost ~9x)."""
    long, short = (plans[k][1]["program_details"] for k in ("0.6b", "0.6b_2048"))
    peak = lambda rows: next(r["peak"] for r in rows if r["name"] == "update")  # noqa: E731
    assert peak(long) <= 4.5 * peak(short), (peak(long) / GIB, peak(short) / GIB)


def test_flop_count_multiplies_scans():
    """XLA's cost analysis counts a loop body once; the plan's count multiplies scans."""
    def f(x, w):
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=10)[0]

    x = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    count = flops.count_traced(jax.jit(f).trace(x, x))
    assert count.flops == 10 * 2 * 64 ** 3


def test_microbatches_auto_and_errors():
    cfg = config.load("configs/ibpo_gspo.py:smoke", [("optim.microbatches", "auto")])
    assert cfg.optim.microbatches == "auto"
    assert config.from_dict(cfg.to_dict()).optim.microbatches == "auto"
    for bad, message in (("x", 'expected int or "auto"'), ("0", 'must be > 0 or "auto"')):
        with pytest.raises(config.ConfigError, match=message):
            config.load("configs/ibpo_gspo.py:smoke", [("optim.microbatches", bad)])


def test_trainer_resolves_auto_to_one_at_once_for_small_configs():
    """The smoke config's update is tiny next to the host: DESIGN §9's estimate settles
    "auto" at 1 without compiling anything."""
    from ibpo_jax import plan
    from ibpo_jax.runtime import sharding

    cfg = config.load("configs/ibpo_gspo.py:smoke", [("optim.microbatches", "auto")])
    mesh = sharding.make_mesh(data=-1, devices=jax.devices()[:1])
    assert plan.trainer_microbatches(cfg, mesh) == 1


def test_cli_one_line_errors():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    for args, needle in ((["--hardware=h999"], "unknown hardware"),
                         (["--hardware=h100", "--config.optim.microbatches=0"], "must be > 0")):
        proc = subprocess.run([sys.executable, "-m", "ibpo_jax.plan", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and needle in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_cpu_run_that_will_not_fit_the_host_is_refused_naming_the_figures(monkeypatch):
    """issue 59 item 5: on the CPU backend the update's compiled peak per device plus a
    checkpoint's host copy of the train state must fit the memory available; the smoke run
    fits a real host (DESIGN §9's estimate settles it without compiling), and is refused on a
    host of 1 MiB with one line giving both figures and what to change."""
    from ibpo_jax import plan
    from ibpo_jax.runtime import sharding

    cfg = config.load("configs/ibpo_gspo.py:smoke")
    mesh = sharding.make_mesh(data=-1, devices=jax.devices()[:1])
    assert plan.startup_microbatches(cfg, mesh) == cfg.optim.microbatches
    monkeypatch.setattr(plan, "host_capacity", lambda devices: 2 ** 20)
    with pytest.raises(plan.HostMemoryError) as refused:
        plan.startup_microbatches(cfg, mesh)
    line = str(refused.value)
    assert "\n" not in line and line.startswith("this run needs about ")
    assert "0.0 GiB are available: the update's peak " in line
    assert "(1 micro-batch) and a checkpoint's host copy of the train state" in line
    assert line.endswith("train LoRA adapters (--config.model.lora.rank), or on a host with "
                         "more memory")
    from ibpo_jax.trainer import cli

    assert isinstance(refused.value, cli.user_errors())  # one line from the entry points


def test_rows_per_device_give_each_preset_its_count_and_a_shrunk_batch_a_valid_one():
    """issue 58 item 6: the presets count micro-batches by rows per batch device (verl's and
    TRL's convention): on their named hardware that is the count they were sized with, and
    `qwen3_0.6b_math` with 4 prompts (which stopped with "minibatches x microbatches = 64
    must divide prompts_per_step = 4") loads and takes the fewest micro-batches that hold 16
    rows a device."""
    from ibpo_jax import plan

    sized = {"0.6b": (1, 64), "1.7b": (1, 128), "4b": (8, 16), "8b": (8, 32),
             "14b": (4, 128), "32b": (8, 128)}  # batch devices (data x fsdp), micro-batches
    for size, (batch_devices, count) in sized.items():
        cfg = config.load(f"configs/ibpo_gspo.py:qwen3_{size}_math")
        assert plan.rows_microbatches(cfg, batch_devices) == count, size
    for prompts, g, want in ((4, 4, 1), (4, 8, 2), (1, 8, 1)):
        small = config.load("configs/ibpo_gspo.py:qwen3_0.6b_math",
                            [("rollout.prompts_per_step", str(prompts)),
                             ("rollout.group_size", str(g)), ("rollout.sample_chunk", "0")])
        assert plan.rows_microbatches(small, 1) == want
    with pytest.raises(config.ConfigError, match="micro_batch_rows=16: config.optim."
                       "microbatches=4 sets the micro-batches too"):
        config.load("configs/ibpo_gspo.py:qwen3_0.6b_math", [("optim.microbatches", "4")])


def test_a_tiny_models_plan_takes_any_procedural_task_and_refuses_file_tasks():
    """The tiny model's vocabulary is the char tokenizer's: every procedural task has it (not
    only `arith`); a file task needs a checkpoint's tokenizer, and the refusal says so."""
    from ibpo_jax.plan import programs

    load = lambda name: config.load("configs/ibpo_gspo.py:smoke",
                                    [("task.name", name), ("task.path", "/data/x.jsonl")])
    assert programs.model_of(load("countdown"))[0].vocab_size == \
        programs.model_of(load("arith"))[0].vocab_size
    with pytest.raises(ValueError, match="procedural task's char tokenizer.*arith, countdown"):
        programs.model_of(load("math_jsonl"))


def test_the_plan_compiles_slot_refills_own_programs():
    """rollout.refill: the plan's prefill is the store of every prompt of the step (one call)
    and its decode the S slots' legs, B·G / S passes in the worst case; the one-pass sampler's
    plan of the same config calls prefill once per chunk."""
    from ibpo_jax import plan

    base = [("rollout.sample_chunk", "2")]
    chunked = plan.plan_json(config.load("configs/ibpo_gspo.py:smoke", base), "h100", 1,
                             only=("decode",))
    refilled = plan.plan_json(config.load("configs/ibpo_gspo.py:smoke",
                                          [*base, ("rollout.refill", "true")]), "h100", 1,
                              only=("decode",))
    rows = lambda p: {r["name"]: r for r in p["program_details"]}  # noqa: E731
    one, two = rows(chunked), rows(refilled)
    assert one["prefill"]["runs"] == 2 and two["prefill"]["runs"] == 1
    # one weight copy a rollout, shared by its calls (`sampling.generate_fn`'s `cast`)
    assert one["sampling weights"]["runs"] == two["sampling weights"]["runs"] == 1
    assert "slot refill's store" in two["prefill"]["note"]
    assert one["decode"]["runs"] == two["decode"]["runs"] == 2 * 39  # 2 passes of 8 rows
    assert "8 rows" in two["decode"]["note"] and "slot refill" in two["decode"]["note"]
    assert two["decode"]["device_peak"] > 0 and two["prefill"]["device_peak"] > 0
    # The store holds every prompt: more prompt cache than one chunk's.
    assert refilled["resident_bytes_per_device"]["kv_cache_full"] > \
        chunked["resident_bytes_per_device"]["kv_cache_full"]


def test_the_plan_takes_the_labelled_operators_and_compiles_vouched_continuations():
    """The operators that read host labels (`checker`, `vouched_steps`) compile their credit
    with them. `vouched_steps` adds its continuation call, compiled per call: C prefixes x K
    continuations, each prompt P + R wide, R tokens decoded (smoke: C 2, K 8, P 64, R 40), a
    wider cache than the rollout's; no runs in the step's time (their count follows the
    data)."""
    from ibpo_jax import plan

    checker = config.load("configs/ibpo_gspo.py:smoke", [("task.name", "arith"),
                                                          ("ibpo.operator", "checker")])
    assert "credit (φ)" in {r["name"] for r in plan.plan_json(checker, "h100", 1,
                                                              only=("credit",))["program_details"]}
    base = [("rollout.sample_chunk", "2")]
    plain = plan.plan_json(config.load("configs/ibpo_gspo.py:smoke", base), "h100", 1,
                           only=("decode",))
    cfg = config.load("configs/ibpo_gspo.py:smoke", [*base, ("ibpo.operator", "vouched_steps")])
    out = plan.plan_json(cfg, "h100", 1, only=("decode",))  # (the sampler's: compiled)
    rows = {r["name"]: r for r in out["program_details"]}
    before = {r["name"]: r for r in plain["program_details"]}
    assert "vouch: prefill" not in before
    prefill, decode = rows["vouch: prefill"], rows["vouch: decode"]
    assert prefill["runs"] == decode["runs"] == 0
    assert prefill["note"].startswith("2 prompts x 8; per call of 2 prefixes x 8, 104 wide")
    assert decode["note"].startswith("1 x 39 steps (no row ends early), 16 rows")
    # 16 rows of 104 + 40 positions against the rollout's 8 of 64 + 40
    assert decode["device_peak"] > before["decode"]["device_peak"]
    assert out["predicted_step_s"] == pytest.approx(plain["predicted_step_s"], rel=0.05)
    assert any(n.startswith("vouched_steps: its continuation calls are compiled per call")
               for n in out["notes"])


def test_the_plan_compiles_partial_rollouts_rounds():
    """rollout.partial: each round's calls take C = sample_chunk x G rows as prompts of their
    own, as wide as prompt + the longest prefix (P + N - T), and decode T tokens; in steady
    state a step makes (B·G / C) x (N / T) of them (smoke: B 4, G 4, P 64, N 40, T 10)."""
    from ibpo_jax import plan

    cfg = config.load("configs/ibpo_gspo.py:smoke", [("rollout.sample_chunk", "2"),
                                                      ("rollout.partial", "true")])
    r = cfg.rollout
    out = plan.plan_json(cfg, "h100", 1, only=("decode",))
    rows = {x["name"]: x for x in out["program_details"]}
    calls = (r.prompts_per_step // r.sample_chunk) * (r.max_new_tokens // r.round_tokens)
    width = r.max_prompt_len + r.max_new_tokens - r.round_tokens
    assert rows["prefill"]["runs"] == calls and f"{width} wide" in rows["prefill"]["note"]
    assert f"{r.sample_chunk * r.group_size} prompts x 1" in rows["prefill"]["note"]
    assert rows["decode"]["runs"] == calls * (r.round_tokens - 1)
    assert rows["decode"]["device_peak"] > 0 and rows["prefill"]["device_peak"] > 0
    # One call's cache: C rows' prompt + prefix and T slots.
    c = r.sample_chunk * r.group_size
    cfg1 = config.load("configs/ibpo_gspo.py:smoke", [("rollout.sample_chunk", "2")])
    per_token = out["resident_bytes_per_device"]["kv_cache_full"] / (c * (width + r.round_tokens))
    plain = plan.plan_json(cfg1, "h100", 1, only=("decode",))
    assert plain["resident_bytes_per_device"]["kv_cache_full"] == pytest.approx(
        per_token * (r.sample_chunk * r.max_prompt_len + c * r.max_new_tokens))
