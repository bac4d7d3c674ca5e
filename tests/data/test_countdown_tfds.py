"""The countdown TFDS builder and task: array_record splits of plain records, disjoint and
deterministic, prompts and references for the char tokenizer, and the task's reward."""

import pytest

from ibpo_jax.data import countdown, countdown_tfds, get_task
from ibpo_jax.data.tokenizer import CharTokenizer
from tests.data.test_procedural_tfds import check_plain_splits

SIZES = dict(num_train=120, num_validation=20, num_test=20, seed=0)
CONFIG = countdown.CountdownConfig(min_numbers=4, max_numbers=5)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return get_task("countdown", config=CONFIG, **SIZES,
                    data_dir=str(tmp_path_factory.mktemp("tfds")))


def test_splits_are_disjoint_plain_records(task):
    splits = {s: task.split(s) for s in ("train", "validation", "test")}
    record = check_plain_splits(splits, {"train": 120, "validation": 20, "test": 20}, {
        "id": str, "question": str, "reference": str, "numbers": list, "target": int,
        "max_value": int, "num_steps": int, "num_solutions": int, "num_solutions_all": int})
    assert all(type(x) is int for x in record["numbers"])
    assert sorted(splits["train"][i]["id"] for i in range(120)) == sorted(
        f"train/{i}" for i in range(120))


def test_records_are_the_generators_and_fit_the_char_tokenizer(task):
    test = task.split("test")
    direct = countdown.generate(CONFIG, 1, 20, id_prefix="test/")  # seed 0 * 1000 + test's 1
    assert sorted((test[i] for i in range(20)), key=lambda r: r["id"]) == sorted(
        direct, key=lambda r: r["id"])  # (tfds stores them in an order of its own)
    tok = CharTokenizer()
    for r in direct:
        prompt, reference = task.prompt_text(r), task.reference_text(r)
        assert prompt == r["question"] + "\n"
        assert tok.decode(tok.encode(prompt + reference)) == prompt + reference
        assert countdown.check(reference, r).correct


def test_task_name_reward_and_config_name(task):
    assert (task.name, task.reward) == ("countdown", "countdown")
    name = countdown_tfds.CountdownBuilderConfig.make(CONFIG, **SIZES).name
    assert name == "n4-5_x12_max99_t10_k3_120-20-20_seed0"
    with pytest.raises(ValueError, match="has no split 'dev'"):
        task.split("dev")
