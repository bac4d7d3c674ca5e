"""trainer.run_tasks: procedural tasks come from their records (no per-task branches), the char
tokenizer for them, file tasks need paths, and a one-step smoke run of RL on `countdown`."""

import json

import pytest

from ibpo_jax import config
from ibpo_jax.config import ConfigError
from ibpo_jax.config.registry import PROCEDURAL, REWARDS, TASKS
from ibpo_jax.data import tasks
from ibpo_jax.data.tokenizer import CharTokenizer
from ibpo_jax.trainer import loop, run_tasks

# A small countdown: a 200-problem training split and a short warm start keep it seconds long.
COUNTDOWN = {"task.name": "countdown", "task.countdown.num_train": 200,
             "task.countdown.max_numbers": 5, "rollout.max_prompt_len": 32,
             "warm_start.steps": 60, "warm_start.warmup_steps": 10}


def _smoke(data_dir, **extra):
    overrides = {"task.data_dir": str(data_dir), **COUNTDOWN, **extra}
    return config.load("configs/ibpo_gspo.py:smoke", [(k, str(v)) for k, v in overrides.items()])


def test_procedural_tasks_are_registered_tasks_with_a_config_section():
    """One record each (`data.tasks.ProceduralTask`): a TASKS and a REWARDS entry of its name,
    its config section as `config.task.<name>`, its options read from there."""
    assert PROCEDURAL.names() == ["arith", "countdown"]
    assert set(PROCEDURAL.names()) <= set(TASKS.names()) & set(REWARDS.names())
    cfg = config.load("configs/ibpo_gspo.py:countdown")
    for name in PROCEDURAL.names():
        record = PROCEDURAL.get(name)
        assert isinstance(getattr(cfg.task, name), record.section)
        assert tasks.procedural_options(record, cfg.task)["config"] is not None
    assert tasks.procedural_options(PROCEDURAL.get("countdown"), cfg.task)["config"].min_solutions \
        == cfg.task.countdown.min_solutions
    # A task without a section in the assembled config (registered later) takes its defaults.
    assert tasks.procedural_options(PROCEDURAL.get("arith"), object()) == \
        PROCEDURAL.get("arith").options(PROCEDURAL.get("arith").section())


def test_tokenizer_and_file_task_errors(tmp_path):
    cfg = _smoke(tmp_path)
    assert isinstance(run_tasks.build_tokenizer(cfg), CharTokenizer)
    file_task = config.load("configs/ibpo_gspo.py:smoke", [("task.name", "math500")])
    with pytest.raises(ConfigError, match="task 'math500' needs a tokenizer"):
        run_tasks.build_tokenizer(file_task)
    with pytest.raises(ConfigError, match="task 'math500' reads local files"):
        run_tasks.build_task(file_task, CharTokenizer(), "math500", "")


def test_build_task_follows_the_config_section(tmp_path):
    cfg = _smoke(tmp_path, **{"task.countdown.num_train": 30, "task.countdown.min_solutions": 4})
    task, eval_task, split = run_tasks.train_and_eval_tasks(cfg, CharTokenizer())
    assert task is eval_task and split == "validation" and task.name == "countdown"
    train = task.split("train")
    assert len(train) == 30
    assert min(train[i]["num_solutions"] for i in range(30)) >= 4
    assert max(len(train[i]["numbers"]) for i in range(30)) <= 5
    with pytest.raises(ConfigError, match="config.task.countdown.min_target=100: must be in"):
        _smoke(tmp_path, **{"task.countdown.min_target": 100})


def test_smoke_rl_step_on_countdown(smoke_data_dir, tmp_path):
    cfg = _smoke(smoke_data_dir, **{"train.steps": 1, "train.eval_every": 1})
    rows = loop.run(cfg, workdir=tmp_path)
    assert [r["step"] for r in rows] == [0, 1]
    assert "eval_accuracy" in rows[0] and "eval_accuracy" in rows[1]
    assert rows[1]["response_len_mean"] > 0 and 0 <= rows[1]["accuracy"] <= 1
    assert json.loads((tmp_path / "base.json").read_text())["source"].startswith("countdown_")
    assert (tmp_path / "hf_final" / "config.json").exists()
