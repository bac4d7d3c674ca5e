"""The `local` preset (your checkpoint, your JSONL, one device, small): the documented command
with nothing else runs from a random HF Qwen3 checkpoint on a JSONL whose columns are renamed
with config.task.fields; a bad column mapping and a benchmark's missing training split are one
line each, and a benchmark trains on its test split only when told to."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from ibpo_jax import config  # noqa: E402
from ibpo_jax.config import ConfigError  # noqa: E402
from ibpo_jax.config.registry import UnknownSplitError  # noqa: E402
from ibpo_jax.data import formats  # noqa: E402
from ibpo_jax.trainer import run_tasks  # noqa: E402
from tests.test_train import FIXTURES, ROOT, tiny_hf_checkpoint  # noqa: E402

PROBLEMS = [("Compute $3 \\times 4$.", "12"), ("Simplify $\\frac{6}{8}$.", "\\frac{3}{4}"),
            ("What is $2+5$?", "7"), ("What is $9-4$?", "5")]
FIELDS = "question:prompt,solution:answer"  # this file's columns -> math_jsonl's fields


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(checkpoint dir, train.jsonl, test.jsonl): the JSONLs name their columns question and
    solution, not math_jsonl's prompt and answer."""
    root = tmp_path_factory.mktemp("local")
    for name, rows in (("train.jsonl", PROBLEMS), ("test.jsonl", PROBLEMS[:2])):
        (root / name).write_text("".join(json.dumps({"question": q, "solution": a}) + "\n"
                                         for q, a in rows))
    return tiny_hf_checkpoint(root / "ckpt"), root / "train.jsonl", root / "test.jsonl"


def _local(ckpt, train, test, **extra) -> config.RunConfig:
    overrides = {"model.checkpoint": ckpt, "task.path": train, "task.eval_path": test, **extra}
    return config.load("configs/ibpo_gspo.py:local", [(k, str(v)) for k, v in overrides.items()])


def test_fields_parse_from_the_command_line_form():
    assert formats.parse_fields(FIELDS, "math_jsonl") == {"prompt": "question",
                                                          "answer": "solution"}
    assert formats.parse_fields("", "arith") == {}
    for spec, message in (("question", "'question' is not column:field"),
                          ("q:problem", "math_jsonl has no field 'problem'; fields: answer, id"),
                          ("a:prompt,b:prompt", "field 'prompt' is mapped twice"),
                          ("x:", "'x:' is not column:field")):
        with pytest.raises(ValueError, match=message):
            formats.parse_fields(spec, "math_jsonl")
    with pytest.raises(ValueError, match="task 'arith' reads no files"):
        formats.parse_fields("a:b", "arith")


def test_local_preset_reads_renamed_columns_for_training_and_evaluation(files):
    ckpt, train, test = files
    cfg = _local(ckpt, train, test, **{"task.fields": FIELDS})
    tokenizer = run_tasks.build_tokenizer(cfg)
    task, eval_task, split = run_tasks.train_and_eval_tasks(cfg, tokenizer)
    assert task.name == eval_task.name == "math_jsonl" and task is not eval_task
    records, held_out = task.split(cfg.task.train_split), eval_task.split(split)
    assert [(r["problem"], r["answer"]) for r in records] == PROBLEMS
    assert [(r["problem"], r["answer"]) for r in held_out] == PROBLEMS[:2]
    assert "What is $2+5$?" in task.prompt_text(records[2])  # through the chat template
    bad = _local(ckpt, train, test, **{"task.fields": "question:problem"})
    with pytest.raises(ConfigError, match=r"^config.task.fields='question:problem': .* "
                                          "math_jsonl has no field 'problem'"):
        run_tasks.train_and_eval_tasks(bad, tokenizer)
    with pytest.raises(ValueError, match="field 'prompt' is missing"):  # no mapping: named
        run_tasks.train_and_eval_tasks(_local(ckpt, train, test), tokenizer)[0].split("train")


def test_benchmark_trains_on_its_test_split_only_when_told(files):
    ckpt, train, test = files
    lcb = {"task.name": "livecodebench", "task.path": FIXTURES / "livecodebench.jsonl",
           "task.eval_path": ""}
    cfg = _local(ckpt, train, test, **lcb)
    tokenizer = run_tasks.build_tokenizer(cfg)
    task, eval_task, split = run_tasks.train_and_eval_tasks(cfg, tokenizer)
    assert eval_task is task and split == "test"  # no 'validation': the file's one split
    with pytest.raises(UnknownSplitError, match=r"^task 'livecodebench' has no split 'train'; "
                       r"available: \['test'\]; to train on it, set "
                       r"config.task.train_split=test$"):
        task.split(cfg.task.train_split)
    told = _local(ckpt, train, test, **lcb, **{"task.train_split": "test"})
    task, _, _ = run_tasks.train_and_eval_tasks(told, tokenizer)
    assert len(task.split(told.task.train_split)) == len(task.split("test")) > 0


def test_documented_local_command_runs(files, tmp_path):
    """The README's command plus only a step count (1 step, evaluated before and after)."""
    ckpt, train, test = files
    workdir = tmp_path / "run"
    cmd = [sys.executable, "-m", "ibpo_jax.train", "--config=configs/ibpo_gspo.py:local",
           f"--workdir={workdir}", f"--config.model.checkpoint={ckpt}",
           f"--config.task.path={train}", f"--config.task.eval_path={test}",
           f"--config.task.fields={FIELDS}", "--config.train.steps=1",
           "--config.train.eval_every=1"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [0, 1]
    assert "eval_accuracy" in rows[0] and "eval_accuracy" in rows[1]
    assert rows[1]["response_len_mean"] > 0
    run_config = json.loads((workdir / "config.json").read_text())
    assert run_config["preset"] == "local" and run_config["task"]["fields"] == FIELDS
    assert (workdir / "hf_final" / "config.json").exists()


def test_local_preset_is_small_on_one_device_and_needs_a_checkpoint():
    with pytest.raises(ConfigError, match="set config.model.checkpoint"):
        config.load("configs/ibpo_gspo.py:local")
    cfg = config.load("configs/ibpo_gspo.py:local", [("model.checkpoint", "/models/mine")])
    paper = config.load("configs/ibpo_gspo.py:qwen3_0.6b_math")
    assert cfg.task.name == "math_jsonl" and cfg.model.preset == "hf"
    assert cfg.rows_per_step * 4 <= paper.rows_per_step
    assert cfg.rollout.max_new_tokens * 8 <= paper.rollout.max_new_tokens
    assert cfg.mesh.fsdp == 1 and cfg.mesh.tensor == 1
