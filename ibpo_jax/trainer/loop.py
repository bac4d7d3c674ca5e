"""The RL loop: the base policy's evaluation, then RL steps (`rl_step.py`) with periodic
evaluation and checkpoints, resuming from the latest checkpoint of a workdir.

`Trainer` is a run in progress: the run's built parts (`parts.RunParts`, frozen), its train
state and its budget. Everything the next step depends on is a function of (seed, step) and
the checkpointed state, so a run killed at any point and restarted reproduces the
uninterrupted run's metrics.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jax

from ibpo_jax import models
from ibpo_jax.config import RunConfig
from ibpo_jax.models import hf_io, lora
from ibpo_jax.trainer import evaluation
from ibpo_jax.trainer import parts as parts_lib
from ibpo_jax.trainer import rl_step as rl_step_lib
from ibpo_jax.trainer import workdir as workdir_lib
from ibpo_jax.trainer.checkpoint import Checkpointer
from ibpo_jax.trainer.logs import RunLog, read_metrics, summary_table


class Trainer:
    """A run in progress: its built parts (`parts.RunParts`, frozen), the train state and the
    budget spent so far. `run` drives it; benchmarks call `rl_step` directly."""

    def __init__(self, cfg: RunConfig, workdir: str | Path, *, log=None):
        self.parts, self.state = parts_lib.build(cfg, workdir, log=log)
        self.budget = 0.0  # budget_trajectories so far (DESIGN §6), checkpointed

    @property
    def policy(self) -> Any:
        """The policy's full params (LoRA: the frozen base with the trained adapters)."""
        return self.parts.policy(self.state)

    def rl_step(self, s: int) -> tuple[dict[str, float], dict[str, dict]]:
        """RL step `s` (1-based, `rl_step.rl_step`): updates the state and the budget; returns
        the step's metrics and its rows of the record files (`logs.RECORDS`, by file name)."""
        self.state, self.budget, metrics, logged = rl_step_lib.rl_step(
            self.parts, self.state, self.budget, s)
        return metrics, logged

    def restore(self, ckpt: Checkpointer) -> int | None:
        """Restores the newest intact checkpoint, if any, and records the run's config
        (workdir.resume: config checks, fallback past damaged checkpoints); returns its step."""
        run = self.parts
        found = workdir_lib.resume(ckpt, run.cfg, self.state, run.workdir, log=run.say,
                                   record=run.is_main)
        if found is None:
            return None
        last, self.state, meta = found
        run.order.restore(meta["data_position"])
        run.schedule.restored(meta, lambda: ckpt.arrays(last))  # a pending batch: replayed
        # Checkpoints from before the weighted budget counted B x G per step.
        self.budget = float(meta.get("budget_trajectories", last * run.cfg.rows_per_step))
        run.say(f"resumed from {ckpt.directory}/{last} (data position {run.order.position})")
        return last

    def save(self, ckpt: Checkpointer, s: int) -> None:
        run = self.parts
        ckpt.save(s, self.state, *run.schedule.saved({  # (record, pending batch's arrays)
            "step": s, "data_position": run.order.position,
            "budget_trajectories": self.budget, "config": run.cfg.to_dict()}))

    def evaluate(self, log: RunLog | None = None, step: int = 0) -> dict[str, float]:
        """Held-out metrics; with `log`, config.logging.samples samples to it at `step`."""
        run, shown = self.parts, None if log is None else []
        with jax.set_mesh(run.mesh):
            out = evaluation.run(run.cfg, run.eval_generate, self.policy,
                                 records=run.eval_records, task=run.eval_task,
                                 tokenizer=run.tokenizer, pool=run.eval_pool,
                                 second=run.methods.answer(self.policy), shown=shown)
        if shown:
            log.samples(step, run.eval_task.name, shown)
        return out

    def export_hf(self, path: Path) -> None:
        """The policy as an HF checkpoint transformers uses as is, tokenizer and generation
        config included (every process calls it: gathers are collective). LoRA: the adapters
        merged into the weights, and also as a PEFT adapter under `path`/peft_adapter."""
        run = self.parts
        alpha = run.base.options.lora_alpha
        models.save_hf(models.Qwen3LM(run.base.config, run.base.options, lora.fold(
            self.policy, alpha)), path, config_extra=hf_io.special_ids(run.tokenizer))
        hf_io.save_tokenizer(run.tokenizer, path)
        if run.base.options.lora_rank:
            lora.save_peft(self.state.params, path / "peft_adapter", alpha=alpha,
                           dropout=run.base.options.lora_dropout)

    def close(self) -> None:
        self.parts.close()


def run(cfg: RunConfig, *, workdir: str | Path) -> list[dict]:
    """Trains per `cfg`, writing outputs under `workdir` (locked for this run alone; a changed
    config is refused before anything is built); returns the metrics rows. SIGINT / SIGTERM
    stop it after the current step with a checkpoint: raises `workdir.RunStopped`."""
    with (workdir_lib.RunLock(workdir, enabled=jax.process_index() == 0),
          workdir_lib.StopRequest() as stop):
        workdir_lib.check_latest_config(Path(workdir) / "checkpoints", cfg)
        return _run(cfg, workdir=workdir, stop=stop)


def _run(cfg: RunConfig, *, workdir: str | Path, stop: workdir_lib.StopRequest) -> list[dict]:
    trainer = Trainer(cfg, workdir)
    workdir = trainer.parts.workdir
    ckpt = Checkpointer(workdir / "checkpoints", every=cfg.train.checkpoint_every,
                        keep=cfg.train.keep_checkpoints)
    log = None
    try:
        last = trainer.restore(ckpt)
        log = RunLog.for_run(cfg, workdir, last_step=-1 if last is None else last,
                             is_main=trainer.parts.is_main)
        # Wall time over the run's segments: a resumed run continues its logged total.
        done = [r for r in read_metrics(workdir / "metrics.jsonl") if r["step"] <= (last or 0)]
        t_start = time.perf_counter() - (done[-1].get("time_total_s", 0.0) if done else 0.0)
        # The methods' stage before RL (PRM+GSPO: its PRM fitted, or reloaded), budgeted.
        cost, fitted = trainer.parts.methods.prepare(last is None, log.info)
        trainer.budget += cost if last is None else 0.0
        if last is None:
            log.info("evaluating the base policy")
            log.write(0, {**trainer.evaluate(log), **fitted,
                          "budget_trajectories": trainer.budget,
                          "time_total_s": time.perf_counter() - t_start})
        stall = workdir_lib.StallGuard(cfg.optim.epochs * cfg.optim.minibatches)
        for s in range(1 if last is None else last + 1, cfg.train.steps + 1):
            metrics, logged = trainer.rl_step(s)
            for name, row in logged.items():
                log.record(name, row)
            final = s == cfg.train.steps or 0 < cfg.train.budget <= metrics["budget_trajectories"]
            if s % cfg.train.eval_every == 0 or final:
                metrics.update(trainer.evaluate(log, s))
            metrics["time_total_s"] = time.perf_counter() - t_start
            log.write(s, metrics)
            stall.check(s, metrics)  # logged first: the rows show the skipped updates
            stopping = stop.requested() and not final  # a signal: this step is the last
            if ckpt.should_save(s, last=final or stopping):
                trainer.save(ckpt, s)
            if stopping:
                raise workdir_lib.RunStopped(stop.signum, s, ckpt.path(s))
            if final:
                break
        trainer.export_hf(workdir / "hf_final")
    finally:
        if log is not None:
            log.close()
        ckpt.close()
        trainer.close()

    rows = read_metrics(workdir / "metrics.jsonl")
    evals = [r for r in rows if "eval_accuracy" in r]
    if trainer.parts.is_main and evals:
        table = summary_table(evals[0], evals[-1], [r for r in rows if r["step"] > 0])
        (workdir / "summary.md").write_text(table + "\n")
        trainer.parts.say(table)
    return rows

