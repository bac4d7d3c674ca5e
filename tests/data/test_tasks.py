"""get_task over every registered name: splits, rewards, prompts, references, argument errors."""

import os
import pickle

import pytest

from ibpo_jax.config.registry import TASKS, UnknownNameError
from ibpo_jax.data import get_task

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
FILE_TASKS = {
    "math_jsonl": ("math_train.jsonl", "math", "train", 3),
    "math500": ("math500.jsonl", "math", "test", 3),
    "aime24": ("aime24.parquet", "math", "test", 2),
    "olympiadbench": ("olympiadbench.json", "math", "test", 2),
    "livecodebench": ("livecodebench.jsonl", "code", "test", 2),
    "codeforces": ("codeforces.parquet", "code", "test", 1),
}


def test_registry_lists_every_task():
    assert TASKS.names() == sorted([*FILE_TASKS, "aime25", "arith", "countdown"])
    with pytest.raises(UnknownNameError, match="unknown task 'gsm8k'.*valid: aime24"):
        get_task("gsm8k")


@pytest.mark.parametrize("name", sorted(FILE_TASKS))
def test_file_tasks(name):
    file, reward, split, n = FILE_TASKS[name]
    task = get_task(name, path=os.path.join(FIXTURES, file))
    assert (task.name, task.reward) == (name, reward)
    records = task.split(split)
    assert len(records) == n
    assert pickle.loads(pickle.dumps(records[0])) == records[0]
    prompt = task.prompt_text(records[0])
    if reward == "math":  # without a tokenizer: the bare instruction text
        assert prompt == (f"{records[0]['problem']}\n\nPlease reason step by step, and put your "
                          "final answer within \\boxed{}.")
        assert task.reference_text(records[0]) == records[0]["solution"]
    else:
        assert prompt.startswith(records[0]["question"])
        assert "```python code block" in prompt
        assert task.reference_text(records[0]) is None


def test_files_mapping_and_field_renames(tmp_path):
    task = get_task("aime25", files={"test": os.path.join(FIXTURES, "aime25.jsonl"),
                                     "train": os.path.join(FIXTURES, "aime25.jsonl")},
                    fields={"problem": "question"})
    assert len(task.split("train")) == len(task.split("test")) == 2
    with pytest.raises(ValueError, match="exactly one of path= .* or files="):
        get_task("math500")
    with pytest.raises(ValueError, match="exactly one of"):
        get_task("math500", path="a", files={"test": "b"})
    with pytest.raises(ValueError, match="has no split 'train'"):
        get_task("math500", path=os.path.join(FIXTURES, "math500.jsonl")).split("train")
