"""Evaluate a policy: ``python -m ibpo_jax.evaluate --config=configs/ibpo_gspo.py[:preset]
--checkpoint=PATH [--benchmark=name=path ...] [--config.key=value ...]``.

PATH is a run's workdir (its latest checkpoint), one orbax checkpoint step directory, or a
local HF directory. Each benchmark is scored with avg@k (mean accuracy over k =
config.eval.samples samples per problem, config.eval.temperature / top_p) and pass@k; the
result is printed as a markdown table in the layout of the paper's Table 1 and written to
``--out`` (JSON) if given. Without --benchmark, the config's evaluation task is used.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from ibpo_jax import config as config_lib
from ibpo_jax import models
from ibpo_jax.runtime import hostmem, sharding
from ibpo_jax.trainer import batching, cli, evaluation, parts, policy, run_tasks
from ibpo_jax.trainer.checkpoint import Checkpointer
from ibpo_jax.trainer.state import init_state, lora_adapters, make_optimizer, policy_params


def load_policy(cfg: config_lib.RunConfig, path: Path, *, task: Any, tokenizer: Any,
                mesh: Any) -> models.Qwen3LM:
    """The policy at `path`: an HF directory, a run's workdir (latest checkpoint) or a step."""
    hf_config = path / "config.json"
    if hf_config.exists() and json.loads(hf_config.read_text()).get("model_type") == "qwen3":
        return models.load_hf(path, dtype=jnp.dtype(cfg.model.dtype), mesh=mesh,
                              **policy.model_options(cfg))
    if (path / "checkpoints").is_dir():
        ckpt_dir, step = path / "checkpoints", None
    elif path.name.isdigit():
        ckpt_dir, step = path.parent, int(path.name)
    else:
        raise FileNotFoundError(f"--checkpoint {path}: neither an HF directory, a run workdir "
                                "nor an orbax checkpoint step directory")
    ckpt = Checkpointer(ckpt_dir, read_only=True)  # the run may still be writing
    found = ckpt.latest_meta(None if step is None else [step])  # damaged ones skipped
    if found is None:
        raise FileNotFoundError(f"--checkpoint {path}: no readable checkpoint in {ckpt_dir}")
    # The run's own config fixes the state layout (model size, value head, optimizer state);
    # --config only chooses how to evaluate.
    run_cfg = config_lib.from_dict(found[1]["config"])
    base = policy.load_base(run_cfg, task=task, tokenizer=tokenizer, mesh=mesh, log=print)
    optimizer = make_optimizer(run_cfg.optim, total_updates=max(run_cfg.train.steps, 1))
    trained = (lora_adapters(run_cfg, base.params, mesh) if run_cfg.model.lora.rank
               else base.params)  # LoRA: the checkpoint holds the adapters
    step, state, _ = ckpt.restore_latest(  # a damaged step: the newest intact one before it
        init_state(trained, optimizer), log=print,
        steps=[s for s in ckpt.all_steps() if s <= found[0]] if step is None else [step])
    ckpt.close()
    print(f"restored {ckpt_dir}/{step}", flush=True)
    return models.Qwen3LM(base.config, base.options,
                          policy_params(base.options, base.params, state.params), mesh)


def evaluate_benchmarks(cfg: config_lib.RunConfig, checkpoint: str,
                        benchmarks: list[tuple[str, str]]) -> dict[str, dict[str, float]]:
    """{benchmark: metrics}; benchmarks = [(task name, path)], [] = the config's eval task on
    its test split."""
    sharding.initialize_distributed(cfg.train.distributed)  # "auto": if launched as several
    mesh = sharding.make_mesh(data=cfg.mesh.data, fsdp=cfg.mesh.fsdp, tensor=cfg.mesh.tensor)
    tokenizer = run_tasks.build_tokenizer(cfg)
    train_task, eval_task, _ = run_tasks.train_and_eval_tasks(cfg, tokenizer)
    m = load_policy(cfg, Path(checkpoint), task=train_task, tokenizer=tokenizer, mesh=mesh)
    generate = batching.sampler(cfg, m.config, m.options, tokenizer, mesh,
                                num_samples=cfg.eval.samples, evaluation=True)
    if benchmarks:
        todo = [(name, run_tasks.build_task(cfg, tokenizer, name, path))
                for name, path in benchmarks]
    else:
        todo = [(eval_task.name, eval_task)]
    results = {}
    for name, task in todo:
        split = (cfg.task.test_split if task is train_task and cfg.task.test_split in task.splits
                 else run_tasks.default_split(task))
        records = evaluation.problems(cfg, task, split)
        pool = parts.reward_pool(cfg, task.reward)
        try:
            with jax.set_mesh(mesh):
                results[f"{name}/{split}"] = evaluation.run(
                    cfg, generate, m.params, records=records, task=task, tokenizer=tokenizer,
                    pool=pool, desc=f"{name}/{split}", leave=True)
        finally:
            pool.close()
    return results


def table(label: str, results: dict[str, dict[str, float]], samples: int) -> str:
    names = list(results)
    head = "| method | " + " | ".join(names) + " |"
    rule = "|---" * (len(names) + 1) + "|"
    avg = f"| {label} avg@{samples} | " + " | ".join(
        f"{100 * results[n]['eval_accuracy']:.1f}" for n in names) + " |"
    pas = f"| {label} pass@{samples} | " + " | ".join(
        f"{100 * results[n][f'eval_pass_at_{samples}']:.1f}" for n in names) + " |"
    return "\n".join([head, rule, avg, pas])


@cli.entry_point
def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m ibpo_jax.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/ibpo_gspo.py")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--benchmark", action="append", default=[],
                        help="name=path (a TASKS name and its local file); repeatable")
    parser.add_argument("--out", default="", help="write the results as JSON here")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error (also: IBPO_DEBUG=1)")
    args, rest = parser.parse_known_args(argv)
    cfg = config_lib.load(args.config, config_lib.parse_overrides(rest))
    hostmem.reuse_freed_memory()  # CPU runs only; before jax starts its threads
    benchmarks = [tuple(b.split("=", 1)) if "=" in b else (b, "") for b in args.benchmark]
    results = evaluate_benchmarks(cfg, args.checkpoint, benchmarks)
    if jax.process_index() == 0:
        print(table(cfg.algo, results, cfg.eval.samples))
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
