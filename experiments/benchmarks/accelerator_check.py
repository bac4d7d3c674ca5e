"""Accelerator check: what one GPU / TPU does with the 0.6B preset's RL step, in one short run.

The trainer's own RL step (`loop.Trainer.rl_step`, its jitted sampler, `step.credit` and
`step.update`) on random weights of the real Qwen3-0.6B architecture, run as
`configs/ibpo_gspo.py:qwen3_0.6b_math` runs it (bf16 compute, f32 master weights, "dots" remat,
scanned layers, prompts of 1,024 tokens, up to 8,192 new tokens, G = 8) on the first device, for
`--steps` steps (>= 3). Only the prompts per step are reduced (default 2 of the preset's 128,
sized for 8 fsdp devices), and the output says so; nothing else shrinks: a step that runs out of
memory FAILS (exit 1) and says where. Stand-ins for what needs files: accelerator_check_lib.py.

Figures (a table on stdout; all of them, with the run's identity, in the JSON at --out):
  matmul    bf16 n x n matmuls, chained in one jit: measured TFLOP/s beside the chip's spec.
  plan      `ibpo_jax.plan.plan_json(cfg, hardware, devices=1)`, or "plan unavailable: why".
  phases    per step: sample / reward / φ / score / update seconds. sample, reward, φ and
            update are the loop's own timings (time_rollout_s, time_reward_s, time_phi_s,
            time_update_s); score is the update's frozen forward run on its own (the policy's
            log-probs of the sampled tokens), timed apart and taken out of the update's time.
  mfu       model FLOPs (accelerator_check_lib.FLOPS_NOTE) of a step (generation + update) and
            of the update alone over their seconds, against the spec peak and the measured one.
  sampler   generated tokens/s, and the achieved HBM bandwidth against DESIGN §9's decode
            roofline: (sampling weights + each row's filled KV cache) bytes per decode step.
  memory    `device.memory_stats()["peak_bytes_in_use"]` after each phase (cumulative) beside
            the plan's per-program and per-device peaks.
  compile   compilations (jax.monitoring events) and their seconds per step and phase: step 1
            compiles, later steps should not (recompiles), and the jit cache sizes.
  mismatch  sampler vs trainer log-probs of the same tokens in bf16: |Δ| mean / max and the
            importance ratio exp(Δ).

Steady-state figures are medians over steps 2.. (step 1 compiles). The chip comes from
`chips.from_device_kind(device_kind)`; `--chip NAME` names one instead (on CPU: the ratios are
then against an assumed chip, and every output says so). `--tiny` runs the same path at CPU
sizes in seconds (tests/experiments/test_accelerator_check.py). On a lent machine:
experiments/benchmarks/accelerator_check.sh (RESULTS.md, "Accelerator check").

    python experiments/benchmarks/accelerator_check.py [--tiny] [--chip h100] [--out X.json]
        [--steps 3] [--prompts 2] [--override key=value ...] [--time-limit S]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

REPO = Path(__file__).resolve().parents[2]
for _p in (str(REPO), str(Path(__file__).resolve().parent)):  # ibpo_jax, the sibling module
    if _p not in sys.path:
        sys.path.insert(0, _p)
import accelerator_check_lib as lib  # noqa: E402

from experiments import host  # noqa: E402
from ibpo_jax import config as config_lib  # noqa: E402
from ibpo_jax.runtime import chips, hostmem  # noqa: E402

CONFIG = "configs/ibpo_gspo.py:qwen3_0.6b_math"
PHASES = ("sample", "reward", "phi", "score", "update")
_ONE_DEVICE = (("mesh.data", "1"), ("mesh.fsdp", "1"), ("mesh.tensor", "1"),
               ("reward.num_workers", "0"))  # in-process verifier: a few rows per step
_TINY = (("model.preset", "tiny"), ("model.tiny.hidden_size", "64"),
         ("model.tiny.intermediate_size", "128"), ("model.tiny.num_hidden_layers", "2"),
         ("model.tiny.num_attention_heads", "4"), ("model.tiny.num_key_value_heads", "2"),
         ("model.tiny.head_dim", "16"), ("model.logits_chunk", "16"),
         ("rollout.max_prompt_len", "16"), ("rollout.max_new_tokens", "32"))


def run_config(tiny: bool, prompts: int, extra: list[tuple[str, str]]) -> config_lib.RunConfig:
    """The preset on one device with `prompts` prompts per step: its micro-batches keep the
    preset's rows per device (optim.micro_batch_rows: the update's shapes), and the prompts are
    sampled in one call when fewer than the preset's sampler chunk."""
    r = config_lib.load(f"{REPO}/{CONFIG}").rollout
    chunk = r.sample_chunk if r.sample_chunk and prompts % r.sample_chunk == 0 else 0
    return config_lib.load(f"{REPO}/{CONFIG}", [*_ONE_DEVICE, *(_TINY if tiny else ()),
                                                ("rollout.prompts_per_step", str(prompts)),
                                                ("rollout.sample_chunk", str(chunk)), *extra])


def resolve_chip(kind: str, name: str | None) -> tuple[chips.Chip | None, str]:
    """(chip, how it was found): the device kind's row of the table, or the one --chip names
    (assumed when the device is not that chip)."""
    found = chips.from_device_kind(kind)
    if name is None:
        return found, f"from the device kind {kind!r}" if found else \
            f"none: the chip table has no {kind!r} (pass --chip to assume one)"
    named = chips.chip(name)
    if found is not None and found.name == named.name:
        return named, f"--chip {name}, the device's own ({kind!r})"
    return named, f"ASSUMED by --chip {name}: the device is {kind!r}, not this chip"


def commit() -> dict[str, Any]:
    """The code's commit; on a lent machine (no .git) what accelerator_check.sh prepare
    wrote here before the tree travelled."""
    head, dirty = host.git_commit(REPO)
    if head != "unknown" or "IBPO_GIT_COMMIT" not in os.environ:
        return {"commit": head, "dirty": dirty, "source": "git"}
    return {"commit": os.environ["IBPO_GIT_COMMIT"],
            "dirty": os.environ.get("IBPO_GIT_DIRTY", "?") == "1",
            "source": "IBPO_GIT_COMMIT (accelerator_check.sh prepare, before the tree travelled)"}


def measure_matmul(n: int, chain: int, repeats: int) -> dict[str, float]:
    """Best of `repeats` timed calls of `chain` dependent bf16 (n x n) @ (n x n) in one jit."""
    ka, kb = jax.random.split(jax.random.key(1))
    a = jax.random.normal(ka, (n, n), jnp.bfloat16)
    b = (jax.random.normal(kb, (n, n), jnp.float32) / math.sqrt(n)).astype(jnp.bfloat16)
    fn = jax.jit(lambda x, w: jax.lax.fori_loop(0, chain, lambda _, y: y @ w, x))
    jax.block_until_ready(fn(a, b))
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(a, b))
        best = min(best, time.perf_counter() - t)
    return {"n": n, "chain": chain, "seconds": best, "flops_per_s": 2.0 * n**3 * chain / best}


def plan_figures(cfg: config_lib.RunConfig, chip: chips.Chip | None) -> dict[str, Any]:
    """The plan's figures for this run's config, or why there are none (never a stub)."""
    if chip is None:
        return {"available": False, "reason": "plan unavailable: no chip to plan for"}
    try:
        from ibpo_jax import plan as plan_lib

        out = plan_lib.plan_json(cfg, hardware=chip.name, devices=1)
    except Exception as e:  # noqa: BLE001 - the plan is another module's work in progress
        return {"available": False,
                "reason": f"plan unavailable: {type(e).__name__}: {e}"[:400]}
    return {"available": True, "hardware": chip.name, **out}


def run_steps(trainer: lib.BenchTrainer, steps: int, deadline: float, out: dict,
              write: Any) -> None:
    """`steps` RL steps of the trainer, each one's phases, compiles and memory into out["steps"]
    (the JSON rewritten after each, so a killed run leaves what it measured); stops early, and
    says so, when another step would pass `deadline`."""
    for s in range(1, steps + 1):
        last = out["steps"][-1] if out["steps"] else None
        # The last step's time less its compiles: what the next step should take.
        if last and time.perf_counter() + last["wall_s"] - last["compiles_total"]["seconds"] \
                > deadline:
            out["errors"].append(f"--time-limit: stopped after {s - 1} of {steps} steps")
            break
        trainer.last = {}
        mark, t0 = trainer.counter.mark(), time.perf_counter()
        metrics, _ = trainer.rl_step(s)
        wall = time.perf_counter() - t0
        last, score_s = trainer.last, trainer.last["score_s"]
        phases = {"sample": metrics["time_rollout_s"], "reward": metrics["time_reward_s"],
                  "phi": metrics["time_phi_s"], "score": score_s,
                  "update": metrics["time_update_s"] - last["extra_s"]}
        compiles = dict(last.get("compiles", {}))
        total = trainer.counter.since(mark)
        compiles["other"] = {"compiles": total["compiles"] - sum(
            c["compiles"] for c in compiles.values()), "seconds": total["seconds"] - sum(
            c["seconds"] for c in compiles.values())}
        out["steps"].append({
            "step": s, "phases_s": phases, "trainer_step_s": sum(
                v for k, v in phases.items() if k != "score"), "wall_s": wall,
            "compiles": compiles, "compiles_total": total, "mismatch": last["mismatch"],
            "phi_mean": metrics.get("phi_mean"), "accuracy": metrics.get("accuracy"),
            "frac_groups_all_same": metrics.get("frac_groups_all_same"),
            "trainer_logprob_mismatch": metrics.get("logprob_mismatch"),
            "rlen": [int(x) for x in last["rlen"]], "plen": [int(x) for x in last["plen"]]})
        write()


def derive(out: dict, cfg: config_lib.RunConfig, trainer: lib.BenchTrainer,
           chip: chips.Chip | None, measured_peak: float, stats: dict | None) -> None:
    """The figures from the steps: medians over steps 2.. (step 1 compiles)."""
    import numpy as np

    steps = out["steps"]
    steady = steps[1:] or steps
    med = lambda f: statistics.median(f(s) for s in steady)  # noqa: E731
    c = trainer.parts.base.config
    plen, rlen = np.array(steps[-1]["plen"]), np.array(steps[-1]["rlen"])
    g = cfg.rollout.group_size
    flops = {"generate": lib.generate_flops(c, plen, rlen, g),
             "score": lib.forward_flops(cfg, c, plen, rlen),
             "update": lib.update_flops(cfg, c, plen, rlen)}
    flops["step"] = flops["generate"] + flops["update"]  # the trainer's step (no score)
    phases = {p: med(lambda s, p=p: s["phases_s"][p]) for p in PHASES}
    step_s = med(lambda s: s["trainer_step_s"])
    spec = chip.bf16_flops if chip else None

    def mfu(f: float, t: float) -> dict[str, float | None]:
        return {"flops": f, "seconds": t, "of_spec_peak": f / t / spec if spec else None,
                "of_measured_peak": f / t / measured_peak}

    out["rl"] = {"steady_steps": [s["step"] for s in steady], "phases_s": phases,
                 "trainer_step_s": step_s, "flops": flops, "flops_note": lib.FLOPS_NOTE,
                 "mfu_step": mfu(flops["step"], step_s),
                 "mfu_update": mfu(flops["update"], phases["update"]),
                 "mfu_score": mfu(flops["score"], phases["score"]),
                 "phi_mean": steps[-1]["phi_mean"]}
    plan = out["plan"]
    if plan.get("available"):  # the plan's step beside the measured one (same config)
        out["rl"]["plan"] = {"flops_per_step": plan.get("flops_per_step"),
                             "predicted_step_s": plan.get("predicted_step_s"),
                             "measured_over_predicted_step_s":
                                 step_s / plan["predicted_step_s"]
                                 if plan.get("predicted_step_s") else None}
    out["sampler"] = sampler_figures(cfg, c, chip, plen, rlen, phases["sample"])
    compile_figures(out, cfg, trainer)
    out["memory"] = memory_figures(plan, trainer, stats)


def sampler_figures(cfg: config_lib.RunConfig, c: Any, chip: chips.Chip | None, plen: Any,
                    rlen: Any, seconds: float) -> dict[str, Any]:
    """Generated tokens/s and the achieved bandwidth against DESIGN §9's decode roofline."""
    nbytes = lib.decode_bytes(c, jnp.dtype(cfg.model.dtype).itemsize, plen, rlen)
    stored = lib.decode_bytes(c, jnp.dtype(cfg.model.param_dtype).itemsize, plen, rlen)
    bw = nbytes["total_bytes"] / seconds
    bw_stored = stored["total_bytes"] / seconds
    return {
        "generated_tokens": int(rlen.sum()), "seconds": seconds,
        "tokens_per_s": float(rlen.sum()) / seconds, **nbytes,
        "achieved_bytes_per_s": bw,
        "of_spec_bandwidth": bw / chip.hbm_bytes_per_s if chip else None,
        "roofline_s": nbytes["total_bytes"] / chip.hbm_bytes_per_s if chip else None,
        "if_weights_read_as_stored": {
            "itemsize": jnp.dtype(cfg.model.param_dtype).itemsize,
            "total_bytes": stored["total_bytes"], "achieved_bytes_per_s": bw_stored,
            "of_spec_bandwidth": bw_stored / chip.hbm_bytes_per_s if chip else None},
        "note": "seconds: the loop's time_rollout_s (prefill + decode + the tokens' copy to the "
                "host); bytes: DESIGN §9, weights in the compute dtype (its bf16 sampling copy) "
                "once per decode step + every row's filled KV cache (the prompt's counted per "
                "row); the sampler is handed the f32 master weights, so if the compiled decode "
                "reads them as stored each step, if_weights_read_as_stored is the traffic"}


def compile_figures(out: dict, cfg: config_lib.RunConfig, trainer: lib.BenchTrainer) -> None:
    """out["compile"] (step 1's compilations, recompiles after it) and out["mismatch"]."""
    steps = out["steps"]
    first, later = steps[0], steps[1:]
    out["compile"] = {
        "first_step": first["compiles_total"],
        "first_step_by_phase": first["compiles"],
        "recompiles_after_step_1": sum(s["compiles_total"]["compiles"] for s in later),
        "recompiled": sorted({n for s in later for n in s["compiles_total"]["compiled"]}),
        "jit_cache_sizes": trainer.cache_sizes(),
        "counted": "XLA compilations seen through jax.monitoring's "
                   f"{lib.CompileCounter.COMPILE!r} events"}
    if first["compiles_total"]["compiles"] == 0:
        out["errors"].append("compile: no compilation events seen in step 1 (the event names "
                             "of this jax version differ?): counts are not measurements")
    mm = [s["mismatch"] for s in steps]
    out["mismatch"] = {**mm[-1], "step": steps[-1]["step"],
                       "max_abs_over_steps": max(m["max_abs"] for m in mm),
                       # the update's own metric: mean |Δ| against its gradient pass
                       "update_metric_mean_abs": steps[-1]["trainer_logprob_mismatch"],
                       "dtype": cfg.model.dtype, "param_dtype": cfg.model.param_dtype}


def memory_figures(plan: dict, trainer: lib.BenchTrainer, stats: dict | None) -> dict:
    """The device's peak memory beside the plan's, or why there is none."""
    if not stats or "peak_bytes_in_use" not in stats:
        return {"available": False,
                "reason": f"{trainer.device.platform}: memory_stats() has no peak_bytes_in_use"}
    planned = plan.get("peak_bytes_per_device") if plan.get("available") else None
    peak = int(stats["peak_bytes_in_use"])
    return {"available": True, "peak_bytes_in_use": peak,
            "bytes_limit": stats.get("bytes_limit"),
            "peak_after_phase": trainer.memory,
            "plan_peak_bytes_per_device": planned,
            "measured_over_plan": peak / planned if planned else None,
            "plan_programs": plan.get("programs") if planned else None,
            "note": "peak_after_phase is cumulative (the allocator's peak cannot be reset): a "
                    "phase shows its own peak only where it exceeds the phases before it; "
                    "sample runs first, then φ, score, update"}


def table(out: dict) -> str:
    """The figures as a markdown table."""
    m, chip = out["meta"], out["meta"]["chip"]
    rows = [("device", f"{m['device_kind']} ({m['platform']}), jax {m['jax']}", ""),
            ("chip spec", chip["name"] or "none", chip["source"]),
            ("config", m["config"], m["shapes_note"])]
    fmt = lambda x, spec=".3g": "n/a" if x is None else format(x, spec)  # noqa: E731
    pct = lambda x: "n/a" if x is None else f"{100 * x:.3g} %"  # noqa: E731
    mat = out.get("matmul")
    if mat:
        rows.append(("bf16 matmul peak", f"{mat['flops_per_s'] / 1e12:.1f} TFLOP/s",
                     f"{pct(mat['of_spec_peak'])} of spec"))
    p = out["plan"]
    rows.append(("plan", f"fits: {p.get('fits')}" if p["available"] else p["reason"],
                 f"predicted step {fmt(p.get('predicted_step_s'))} s, "
                 f"{fmt(p.get('flops_per_step'))} FLOPs" if p["available"] else ""))
    rl = out.get("rl")
    if rl:
        ph = rl["phases_s"]
        rows.append(("phases (s, median)", " / ".join(f"{ph[k]:.3g}" for k in PHASES),
                     "sample / reward / φ / score / update"))
        for key, label in (("mfu_step", "MFU, RL step"), ("mfu_update", "MFU, update")):
            x = rl[key]
            rows.append((label, f"{pct(x['of_spec_peak'])} of spec",
                         f"{pct(x['of_measured_peak'])} of measured peak; "
                         f"{x['flops']:.3g} FLOPs in {x['seconds']:.3g} s"))
        s = out["sampler"]
        rows.append(("sampler", f"{s['tokens_per_s']:.4g} tokens/s",
                     f"{s['achieved_bytes_per_s'] / 1e9:.4g} GB/s = "
                     f"{pct(s['of_spec_bandwidth'])} of spec bandwidth; roofline "
                     f"{fmt(s['roofline_s'])} s vs {s['seconds']:.3g} s"))
        mem = out["memory"]
        rows.append(("peak HBM", f"{mem['peak_bytes_in_use'] / 2**30:.2f} GiB"
                     if mem["available"] else mem["reason"],
                     f"plan {fmt((mem.get('plan_peak_bytes_per_device') or 0) / 2**30 or None)}"
                     " GiB" if mem["available"] else ""))
        c = out["compile"]
        rows.append(("compiles", f"step 1: {c['first_step']['compiles']} in "
                     f"{c['first_step']['seconds']:.3g} s",
                     f"recompiles after step 1: {c['recompiles_after_step_1']}"))
        mm = out["mismatch"]
        rows.append(("log-prob mismatch, sampler vs trainer",
                     f"mean abs Δ {mm['mean_abs']:.3g}, max {mm['max_abs']:.3g}",
                     f"exp(Δ) mean {mm['ratio_mean']:.4f}, [{mm['ratio_min']:.3f}, "
                     f"{mm['ratio_max']:.3f}]"))
    rows.append(("status", out["status"], "; ".join(out["errors"])))
    return "\n".join(["| figure | value | against / note |", "|---|---|---|",
                      *(f"| {a} | {b} | {c} |" for a, b, c in rows)])


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list, config_lib.RunConfig]:
    """The command line, its overrides as (key, value) and the run's config."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="CPU-sized model and shapes")
    parser.add_argument("--chip", help="compute the ratios against this chip of "
                        f"ibpo_jax/runtime/chips.py ({', '.join(chips.CHIPS)})")
    parser.add_argument("--out", default="accelerator_check.json", help="the JSON's path")
    parser.add_argument("--steps", type=int, default=3, help="RL steps (>= 3)")
    parser.add_argument("--prompts", type=int, default=2,
                        help="prompts per step (the preset's 128 are for 8 fsdp devices)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="config override (repeatable; recorded in the output)")
    parser.add_argument("--time-limit", type=float, default=540.0,
                        help="seconds: no step starts that would end past it")
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error("--steps: at least 3 (recompiles show from step 2 on)")
    if bad := [o for o in args.override if "=" not in o]:
        parser.error(f"--override: expected KEY=VALUE, got {bad}")
    if args.chip:
        try:
            chips.chip(args.chip)
        except chips.UnknownChipError as e:
            parser.error(f"--chip: {e}")
    extra = [tuple(o.split("=", 1)) for o in args.override]
    try:
        cfg = run_config(args.tiny, args.prompts, extra)
    except ValueError as e:  # config.ConfigError names the key
        parser.error(f"--override / --prompts: {e}")
    return args, extra, cfg


def metadata(args: argparse.Namespace, extra: list, cfg: config_lib.RunConfig,
             preset: config_lib.RunConfig, device: Any, chip: chips.Chip | None,
             chip_source: str) -> dict[str, Any]:
    """The run's identity: software, device, chip, config, and the shapes it runs at."""
    shapes = {"prompts_per_step": cfg.rollout.prompts_per_step,
              "preset_prompts_per_step": preset.rollout.prompts_per_step,
              "group_size": cfg.rollout.group_size,
              "rows": cfg.rollout.prompts_per_step * cfg.rollout.group_size,
              "max_prompt_len": cfg.rollout.max_prompt_len,
              "max_new_tokens": cfg.rollout.max_new_tokens,
              "microbatches": cfg.optim.microbatches, "layout": cfg.update_layout,
              "micro_batch_rows": cfg.optim.micro_batch_rows,
              "attention": getattr(cfg.model, "attention", None), "remat": cfg.model.remat,
              "dtype": cfg.model.dtype, "param_dtype": cfg.model.param_dtype}
    note = (f"prompts per step {cfg.rollout.prompts_per_step} of the preset's "
            f"{preset.rollout.prompts_per_step} (one device)"
            + ("; --tiny: a tiny model and shapes, NOT the preset's" if args.tiny else ""))
    return {"jax": jax.__version__, "device_kind": device.device_kind,
            "platform": device.platform, "devices": len(jax.devices()),
            "cpu_model": host.cpu_model(), "git": commit(), "config": CONFIG,
            "overrides": [f"{k}={v}" for k, v in extra], "tiny": args.tiny,
            "shapes": shapes, "shapes_note": note, "steps_asked": args.steps,
            "chip": {"name": chip.name if chip else None, "source": chip_source,
                     **({"bf16_flops": chip.bf16_flops, "hbm_bytes": chip.hbm_bytes,
                         "hbm_bytes_per_s": chip.hbm_bytes_per_s} if chip else {})}}


def measure(out: dict, cfg: config_lib.RunConfig, chip: chips.Chip | None, steps: int,
            deadline: float, measured_peak: float, write: Any) -> None:
    """The RL steps, the plan and the figures into `out`; a failure is recorded there (its
    status), never raised."""
    trainer = None
    try:
        trainer = lib.BenchTrainer(cfg, lib.CompileCounter())
        # as the trainer resolved it
        out["meta"]["shapes"]["microbatches"] = trainer.parts.spec.optim.microbatches
        run_steps(trainer, steps, deadline, out, write)
        if len(out["steps"]) < steps:  # the figures of the steps that ran, flagged
            out["errors"].append(f"only {len(out['steps'])} of {steps} steps ran" + (
                ": the figures are step 1's, compiles included" if len(out["steps"]) == 1
                else ""))
        stats = trainer.device.memory_stats()  # before the plan's own compiles
        # After the steps: the plan compiles every program of a step itself, which must not
        # count as the steps' compiles nor delay them; skipped when that would pass the limit.
        left, need = deadline - time.perf_counter(), out["steps"][0]["compiles_total"]["seconds"]
        out["plan"] = plan_figures(cfg, chip) if left > need else {
            "available": False, "reason": f"plan unavailable: skipped, {left:.0f} s left of "
            f"--time-limit and step 1 compiled for {need:.0f} s"}
        derive(out, cfg, trainer, chip, measured_peak, stats)
        out["status"] = "ok" if not out["errors"] else "incomplete"
    except Exception as e:  # noqa: BLE001 - recorded, and the exit status says it failed
        text = f"{type(e).__name__}: {e}"
        oom = "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()
        out["status"] = "failed" + (": out of memory at the stated shapes (not shrunk)"
                                    if oom else "")
        out["errors"].append(text[:2000])
        if not out["plan"]["available"] and deadline - time.perf_counter() > 60:
            out["plan"] = plan_figures(cfg, chip)  # what the plan says of the failed shapes
    finally:
        if trainer is not None:
            trainer.close()


def main(argv: list[str] | None = None) -> int:
    args, extra, cfg = parse_args(argv)
    preset = config_lib.load(f"{REPO}/{CONFIG}")
    t_start = time.perf_counter()
    deadline = t_start + args.time_limit
    try:
        hostmem.reuse_freed_memory()  # as the entry points do (ibpo_jax/runtime/hostmem.py)
    except RuntimeError:  # called in a process whose jax already started (the tests)
        pass
    device = jax.devices()[0]
    chip, chip_source = resolve_chip(device.device_kind, args.chip)
    out: dict[str, Any] = {
        "meta": metadata(args, extra, cfg, preset, device, chip, chip_source),
        "status": "running", "errors": [], "steps": []}
    path = Path(args.out)

    def write() -> None:
        out["elapsed_s"] = time.perf_counter() - t_start
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1, default=float) + "\n")

    print(f"chip: {chip.name if chip else 'none'} ({chip_source}); "
          f"{out['meta']['shapes_note']}", file=sys.stderr)
    mat = measure_matmul(*((256, 2) if args.tiny else (8192, 16)), repeats=3)
    mat["of_spec_peak"] = mat["flops_per_s"] / chip.bf16_flops if chip else None
    out["matmul"] = mat
    out["plan"] = {"available": False, "reason": "plan unavailable: not reached"}
    write()
    measure(out, cfg, chip, args.steps, deadline, mat["flops_per_s"], write)
    write()
    print(table(out))
    print(f"wrote {path}", file=sys.stderr)
    return 0 if out["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
