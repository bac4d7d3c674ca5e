"""``python -m ibpo_jax.plan --config=configs/ibpo_gspo.py:PRESET --hardware=NAME
[--devices=N] [--json] [--config.key=value ...]``

Compiles every program of one RL step of the config for its mesh on N devices (simulated CPU
devices where no accelerator is present) and prints per-device memory, FLOPs per step and a
roofline step time on N chips of --hardware (ibpo_jax/runtime/chips.py). Exit status 0 when it fits,
1 with one line naming the program, the bytes and the knob when it does not, 2 for a config or
hardware error (one line).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

GIB = 2 ** 30


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="python -m ibpo_jax.plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/ibpo_gspo.py", help="config file[:preset]")
    p.add_argument("--hardware", required=True,
                   help="a chip of ibpo_jax/runtime/chips.py, e.g. h100")
    p.add_argument("--devices", type=int, default=0,
                   help="chips (default: every accelerator present; on CPU the preset's "
                   "hardware count, else the product of the mesh's fixed axes)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--only", default="", help="compile only these programs, comma-separated "
                   "(e.g. update,decode: quicker checks, same figures as the full plan; also "
                   "compiled: the programs whose outputs they take, the sampler's weight copy "
                   "and φ; the others count FLOPs only)")
    p.add_argument("--lengths", default="paper", help="response lengths the step time is "
                   "also given for: paper (a stated mix of short right and long wrong answers, "
                   "plan/lengths.py), metrics:PATH (a run's metrics.jsonl) or max (the worst "
                   "case only)")
    p.add_argument("--verbose", action="store_true", help="log each compile to stderr")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p.parse_known_args(argv)


def default_devices(cfg) -> int:
    """The device count of the hardware the config's preset is sized for (configs/base.py
    QWEN3_HARDWARE, e.g. 8 for qwen3_8b_math), else the product of the mesh's fixed axes."""
    try:
        from configs import base  # the repository's config package (absent when installed)
    except ImportError:
        base = None
    for size, (_, count) in getattr(base, "QWEN3_HARDWARE", {}).items():
        if cfg.preset == f"qwen3_{size}_math":
            return count
    m = cfg.mesh
    return max(1, m.data) * max(1, m.fsdp) * max(1, m.tensor)


def _human(x: float, unit: str = "") -> str:
    for scale, suffix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {suffix}{unit}"
    return f"{x:.3g} {unit}"


def table(out: dict) -> str:
    g = lambda b: f"{b / GIB:.2f}"  # noqa: E731
    lines = [f"plan: {out['hardware']} x {out['devices']} (mesh {out['mesh']}, compiled on "
             f"{out['backend']}), attention {out['attention']}, remat {out['remat']}, "
             f"optim.microbatches {out['microbatches']}",
             "", "| program | runs/step | argument GiB | output GiB | temp GiB | peak GiB | "
             "device peak GiB | FLOPs/run | roofline s/run | bound | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in out["program_details"]:
        lines.append(f"| {r['name']} | {r['runs']:g} | {g(r['argument'])} | {g(r['output'])} | "
                     f"{g(r['temp'])} | {g(r['peak'])} | {g(r['device_peak'])} | "
                     f"{_human(r['flops_per_run'])} | {r['roofline_s_per_run']:.3g} | "
                     f"{r['bound']} | {r['note']} |")
    res = out["resident_bytes_per_device"]
    lines += ["", "resident per device: " + ", ".join(f"{k} {g(v)} GiB" for k, v in res.items()),
              "(device peak = the program's peak + resident state it does not take as an "
              "argument)",
              f"peak per device: {g(out['peak_bytes_per_device'])} GiB ({out['peak_program']})"
              f" of {g(out['hbm_bytes_per_device'])} GiB usable -> "
              f"{'FITS' if out['fits'] else 'DOES NOT FIT'}",
              "without XLA:CPU's float32 copy of the sampler's bf16 weights (an estimate, "
              "2 x the copy's bytes out of the sampler programs' temporaries): "
              f"{g(out.get('peak_bytes_per_device_without_cpu_weight_upcast', 0))} GiB",
              f"FLOPs per RL step: {_human(out['flops_per_step'])}; predicted step time "
              f"(roofline): {out['predicted_step_s']:.1f} s"]
    a = out["analytic"]
    lines.append("DESIGN §9: update peak " + g(a["update_peak"]) + " GiB (master "
                 f"{g(a['master'])}, Adam {g(a['adam'])}, grads {g(a['grads'])}, reference "
                 f"{g(a['reference'])}, activations {g(a['activations'])}), KV cache "
                 f"{g(a['kv_cache'])} GiB, FLOPs {_human(a['flops'])}")
    lines += _lengths_lines(out.get("lengths"))
    lines += [f"disagrees with DESIGN §9: {d}" for d in out["disagreements"]]
    lines += [f"note: {n}" for n in out["notes"]]
    return "\n".join(lines)


def _lengths_lines(lengths: dict | None) -> list[str]:
    """The step under a response-length distribution: decode steps, wasted slot-steps and
    step time for the sampler today, with refill and with partial rollouts."""
    if not lengths:
        return []
    lines = [f"responses: {lengths['source']}: mean {lengths['mean_length']:.0f} tokens, "
             f"{lengths['at_limit']:.0%} at the limit; {lengths['slots']} decode slots; worst "
             f"case (every row to the limit) {lengths['worst_case_decode_steps']:g} decode steps",
             "| sampler | decode steps | wasted slot-steps | step time (roofline) s |",
             "|---|---|---|---|"]
    names = {"today": "today (calls until their longest row)",
             "refill": "refill (rollout.refill, a block of 1)",
             "partial": "refill + partial rollouts (rollout.partial; prefixes re-encoded: "
                        "priced at the prefill's rate)"}
    for key, c in lengths["schedules"].items():
        lines.append(f"| {names[key]} | {c['decode_steps']:.0f} | "
                     f"{c['wasted_slot_steps'] / max(c['slot_steps'], 1):.0%} | "
                     f"{c['step_s']:.1f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    args, rest = parse(sys.argv[1:] if argv is None else argv)
    from ibpo_jax import config
    from ibpo_jax.runtime import chips

    try:
        cfg = config.load(args.config, config.parse_overrides(rest))
        chips.chip(args.hardware)
    except (config.ConfigError, chips.UnknownChipError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    devices = args.devices or default_devices(cfg)
    # Simulated devices must be asked for before jax starts; the flag only concerns the host
    # platform, so on a GPU/TPU machine the real devices are used.
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (f"{flags} --xla_force_host_platform_device_count="
                                   f"{devices}").strip()
    import jax

    from ibpo_jax import plan

    if not args.devices and jax.default_backend() != "cpu":
        devices = None  # every accelerator present
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if args.verbose else None
    try:
        out = plan.plan_json(cfg, args.hardware, devices, log=log,
                             only=tuple(args.only.split(",")) if args.only else None,
                             lengths=args.lengths)
    except (plan.PlanError, ValueError) as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out) if args.json else table(out))
    if not out["fits"]:
        print(f"does not fit: {out['error']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
