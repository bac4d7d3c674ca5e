"""Which tasks and tokenizer a run uses: the training and evaluation tasks of a config.

Procedural tasks (generated here, scored by their own step checker, read with the char
tokenizer) are the entries of `PROCEDURAL`: task name -> the task's keyword arguments from its
config section `config.task.<name>`. Every other task reads local files with the checkpoint's
tokenizer. A new procedural task is one entry here and one config section.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ibpo_jax.config import ConfigError, RunConfig
from ibpo_jax.data import arith, countdown, get_task
from ibpo_jax.data.tokenizer import CharTokenizer
from ibpo_jax.trainer import policy


def _arith_options(cfg: RunConfig) -> dict[str, Any]:
    a = cfg.task.arith
    return {"config": arith.ArithConfig(a.num_steps, a.digits, a.ops, a.max_value)}


def _countdown_options(cfg: RunConfig) -> dict[str, Any]:
    c = cfg.task.countdown
    return {"config": countdown.CountdownConfig(
        min_numbers=c.min_numbers, max_numbers=c.max_numbers, max_number=c.max_number,
        max_value=c.max_value, min_target=c.min_target, min_solutions=c.min_solutions),
        "num_train": c.num_train}


PROCEDURAL: dict[str, Callable[[RunConfig], dict[str, Any]]] = {
    "arith": _arith_options,
    "countdown": _countdown_options,
}


def build_tokenizer(cfg: RunConfig, *, vocab_size: int | None = None) -> Any:
    """The char tokenizer for a procedural task without config.tokenizer.path, else the local
    HF tokenizer of config.tokenizer.path or the model checkpoint."""
    if cfg.task.name in PROCEDURAL and not cfg.tokenizer.path:
        return CharTokenizer()
    from ibpo_jax.data import hf

    path = cfg.tokenizer.path or cfg.model.checkpoint
    if not path:
        raise ConfigError(f"task {cfg.task.name!r} needs a tokenizer: set config.tokenizer.path "
                         "or config.model.checkpoint (a local HF directory)")
    return hf.load_tokenizer(path, vocab_size=vocab_size)


def build_task(cfg: RunConfig, tokenizer: Any, name: str, path: str) -> Any:
    """Task `name` (a registry.TASKS entry); file-backed tasks read `path`."""
    if name in PROCEDURAL:
        return get_task(name, **PROCEDURAL[name](cfg),
                        data_dir=str(policy.data_dir(cfg) / "tfds"))
    if not path:
        raise ConfigError(f"task {name!r} reads local files: give its path (config.task.path / "
                         "config.task.eval_path, or --benchmark=name=path)")
    if isinstance(tokenizer, CharTokenizer):
        return get_task(name, path=path)
    return get_task(name, path=path, tokenizer=tokenizer, enable_thinking=cfg.task.thinking)


def train_and_eval_tasks(cfg: RunConfig, tokenizer: Any) -> tuple[Any, Any, str]:
    """(training task, evaluation task, evaluation split)."""
    task = build_task(cfg, tokenizer, cfg.task.name, cfg.task.path)
    if not cfg.task.eval_name:
        return task, task, cfg.task.eval_split
    eval_task = build_task(cfg, tokenizer, cfg.task.eval_name, cfg.task.eval_path)
    split = cfg.task.eval_split if cfg.task.eval_split in eval_task.splits else None
    return task, eval_task, split or default_split(eval_task)


def default_split(task: Any) -> str:
    return "test" if "test" in task.splits else sorted(task.splits)[0]
