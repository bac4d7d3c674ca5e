"""What a CPU run holds beyond the plan (issue 59, item 5): the trainer's resident memory per
step, with a checkpoint every step against none until the end, beside the plan's peak.

    python -m experiments.benchmarks.host_memory [--steps 4] [--hidden 1024] [--layers 8]

Runs `python -m ibpo_jax.train` twice on the `smoke` preset with a larger `tiny` model (the
arith task's char tokenizer keeps the vocabulary small, so the state is the layers'), no warm
start, and samples the process's resident set (VmRSS) every 50 ms; a step's peak is the
largest sample between its metrics row and the one before. Prints both runs' per-step peaks,
their difference from step 2 on, the train state's bytes (params + Adam: what a checkpoint
copies to the host) and the plan's per-device peak for the same config.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.host import cpu_model

GIB = 2 ** 30


def overrides(args: argparse.Namespace) -> list[str]:
    h = args.hidden
    return [f"--config.model.tiny.hidden_size={h}",
            f"--config.model.tiny.intermediate_size={3 * h}",
            f"--config.model.tiny.num_hidden_layers={args.layers}",
            f"--config.model.tiny.num_attention_heads={h // 64}",
            f"--config.model.tiny.num_key_value_heads={h // 128}",
            "--config.model.tiny.head_dim=64", "--config.warm_start.enabled=false",
            f"--config.train.steps={args.steps}", "--config.train.eval_every=1000",
            "--config.train.progress=false", "--config.optim.microbatches=1"]


def rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run(args: argparse.Namespace, workdir: Path, checkpoint_every: int) -> list[int]:
    """Per-step peak resident bytes of one run (index 0: start-up and the base evaluation)."""
    cmd = [sys.executable, "-m", "ibpo_jax.train", "--config=configs/ibpo_gspo.py:smoke",
           f"--workdir={workdir}", f"--config.task.data_dir={args.data_dir}",
           f"--config.train.checkpoint_every={checkpoint_every}", *overrides(args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
    metrics, peaks, peak, seen = workdir / "metrics.jsonl", [], 0, 0
    while proc.poll() is None:
        peak = max(peak, rss(proc.pid))
        rows = metrics.read_text().count("\n") if metrics.exists() else 0
        if rows > seen:
            peaks += [peak] * (rows - seen)
            seen, peak = rows, 0
        time.sleep(0.05)
    if proc.returncode:
        sys.exit(f"the run failed:\n{proc.stderr.read()[-2000:]}")
    return peaks


def plan_peak(args: argparse.Namespace) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "ibpo_jax.plan", "--config=configs/ibpo_gspo.py:smoke",
         "--hardware=h100", "--devices=1", "--json", "--only=update",
         f"--config.task.data_dir={args.data_dir}", *overrides(args)],
        capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--data-dir", default="")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        args.data_dir = args.data_dir or str(Path(tmp) / "data")
        every = run(args, Path(tmp) / "every", 1)
        end = run(args, Path(tmp) / "end", 1000)
        plan = plan_peak(args)
    resident = plan["resident_bytes_per_device"]
    state = resident["params"] + resident["adam"]
    print(f"host memory per step, {cpu_model()}, {os.cpu_count()} cores; tiny model hidden "
          f"{args.hidden}, {args.layers} layers, {args.steps} steps")
    print("| step | peak RSS, checkpoint every step GiB | peak RSS, none until the end GiB |")
    print("|---|---|---|")
    for i, (a, b) in enumerate(zip(every, end)):
        print(f"| {i} | {a / GIB:.2f} | {b / GIB:.2f} |")
    later = max(every[2:]) - max(end[2:-1] or end[2:])
    print(f"checkpointing adds {later / GIB:.2f} GiB from step 2 on; the train state (params + "
          f"Adam, a checkpoint's host copy) is {state / GIB:.2f} GiB "
          f"(ratio {later / state:.2f}); the plan's peak: "
          f"{plan['peak_bytes_per_device'] / GIB:.2f} GiB ({plan['peak_program']})")


if __name__ == "__main__":
    main()
