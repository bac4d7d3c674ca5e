"""Which tasks and tokenizer a run uses: the training and evaluation tasks of a config.

Procedural tasks (`registry.PROCEDURAL`: generated, scored by their own step checker, read with
the char tokenizer) take their keyword arguments from their config section
`config.task.<name>` (`data.tasks.procedural_options`). Every other task reads local files with the
checkpoint's tokenizer.
"""

from __future__ import annotations

from typing import Any

from ibpo_jax.config import ConfigError, RunConfig
from ibpo_jax.config.registry import PROCEDURAL
from ibpo_jax.data import formats, get_task, tasks
from ibpo_jax.data.tokenizer import CharTokenizer
from ibpo_jax.trainer import policy, step_labels


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


def build_task(cfg: RunConfig, tokenizer: Any, name: str, path: str, *,
               fields: dict[str, str] | None = None) -> Any:
    """Task `name` (a registry.TASKS entry); file-backed tasks read `path`, their columns
    renamed by `fields` ({canonical: column}, formats.parse_fields)."""
    if name in PROCEDURAL:
        return get_task(name, **tasks.procedural_options(PROCEDURAL.get(name), cfg.task),
                        data_dir=str(policy.data_dir(cfg) / "tfds"))
    if not path:
        raise ConfigError(f"task {name!r} reads local files: give its path (config.task.path / "
                         "config.task.eval_path, or --benchmark=name=path)")
    if isinstance(tokenizer, CharTokenizer):
        return get_task(name, path=path, fields=fields)
    return get_task(name, path=path, fields=fields, tokenizer=tokenizer,
                    enable_thinking=cfg.task.thinking)


def task_fields(cfg: RunConfig, name: str) -> dict[str, str]:
    """config.task.fields as task `name`'s column mapping: it applies to the training task and
    to an evaluation task of the same file format; a bad entry is a ConfigError naming it."""
    def kind(task: str) -> str:  # the file format (math500 and aime24 differ)
        return formats.CONVERTERS.get(task, (task,))[0]

    if kind(name) != kind(cfg.task.name):
        return {}
    try:
        return formats.parse_fields(cfg.task.fields, name)
    except ValueError as e:
        raise ConfigError(f"config.task.fields={cfg.task.fields!r}: {e}") from None


def train_and_eval_tasks(cfg: RunConfig, tokenizer: Any) -> tuple[Any, Any, str]:
    """(training task, evaluation task, evaluation split). The evaluation task is
    config.task.eval_name, else the training task, reading config.task.eval_path when given
    (file tasks); a split the evaluation task lacks falls back to `default_split` (a
    benchmark's file is its only split, "test")."""
    t = cfg.task
    task = build_task(cfg, tokenizer, t.name, t.path, fields=task_fields(cfg, t.name))
    step_labels.check_task(cfg.ibpo, task)  # the operator reads what the task gives
    eval_task = task
    if t.eval_name or (t.eval_path and t.name not in PROCEDURAL):
        name = t.eval_name or t.name
        eval_task = build_task(cfg, tokenizer, name, t.eval_path, fields=task_fields(cfg, name))
    split = t.eval_split if t.eval_split in eval_task.splits else default_split(eval_task)
    return task, eval_task, split


def default_split(task: Any) -> str:
    return "test" if "test" in task.splits else sorted(task.splits)[0]
