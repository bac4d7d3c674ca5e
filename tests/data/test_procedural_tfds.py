"""The generic procedural-task TFDS module: a task declares only its features, config naming
and generator; records come back decoded by feature type, in the declared key order."""

import pickle

import numpy as np
import pytest
import tensorflow_datasets as tfds

from ibpo_jax.config.registry import UnknownSplitError
from ibpo_jax.data import procedural_tfds


def check_plain_splits(splits: dict, sizes: dict[str, int], types: dict[str, type]) -> dict:
    """Asserts what every procedural task's splits share: the sizes, pairwise disjoint
    questions, plain picklable records with `types`, and an IndexError naming the task past
    the end. Returns the last train record."""
    assert {s: len(src) for s, src in splits.items()} == sizes
    questions = {s: {src[i]["question"] for i in range(len(src))} for s, src in splits.items()}
    assert not questions["train"] & questions["test"]
    assert not questions["train"] & questions["validation"]
    assert not questions["validation"] & questions["test"]
    record = splits["train"][-1]
    assert {k: type(v) for k, v in record.items()} == types
    assert list(record) == list(types)  # the declared key order
    test = splits["test"]
    assert pickle.loads(pickle.dumps(test))[3] == test[3]
    with pytest.raises(IndexError, match=f"{test.task} test index {sizes['test']} out of range"):
        test[sizes["test"]]
    return record


def _toy_generate(problem: str, seed: int, n: int, *, exclude, id_prefix: str) -> list[dict]:
    # Questions "<seed>:<i>" differ across splits (their seeds differ), so `exclude` never hits.
    records = [{"id": f"{id_prefix}{i}", "question": f"{seed}:{i}", "reference": problem * i,
                "tag": problem, "pair": [seed, i], "total": seed + i} for i in range(n)]
    assert not exclude & {r["question"] for r in records}
    return records


class ToyConfig(procedural_tfds.ProceduralBuilderConfig):
    @classmethod
    def make(cls, problem: str, **sizes) -> "ToyConfig":
        return cls.named(f"p{problem}", problem, **sizes)


class IbpoToy(procedural_tfds.ProceduralBuilder, skip_registration=True):
    BUILDER_CONFIGS = []
    FEATURES = {"tag": tfds.features.Text(), "pair": tfds.features.Sequence(np.int64),
                "total": np.int64}
    DESCRIPTION = "toy"
    generate = staticmethod(_toy_generate)


TYPES = {"id": str, "question": str, "reference": str, "tag": str, "pair": list, "total": int}


def test_a_toy_task_builds_and_reads_back_its_generators_records(tmp_path):
    config = ToyConfig.make("ab", num_train=6, num_validation=4, num_test=5, seed=2)
    assert config.name == "pab_6-4-5_seed2"
    splits = {s: procedural_tfds.load_split(IbpoToy, config, s, str(tmp_path))
              for s in ("train", "validation", "test")}
    record = check_plain_splits(splits, {"train": 6, "validation": 4, "test": 5}, TYPES)
    # split seeds: seed * 1000 + 1 (test), 2 (validation), 3 (train)
    by_id = {r["id"]: r for r in (splits["train"][i] for i in range(6))}
    assert by_id["train/4"] == {"id": "train/4", "question": "2003:4", "reference": "abababab",
                                "tag": "ab", "pair": [2003, 4], "total": 2007}
    assert all(type(x) is int for x in record["pair"])
    assert sorted(splits["test"][i]["question"] for i in range(5)) == [
        f"2001:{i}" for i in range(5)]
    assert (tmp_path / "ibpo_toy" / config.name / "1.0.0").is_dir()
    with pytest.raises(UnknownSplitError, match="toy has no split 'dev'"):
        procedural_tfds.load_split(IbpoToy, config, "dev", str(tmp_path))


def test_only_the_tasks_builders_are_registered_with_tfds():
    from ibpo_jax.data import arith_tfds, countdown_tfds  # registers their builders

    assert (arith_tfds.IbpoArith.task_name(), countdown_tfds.IbpoCountdown.task_name()) == (
        "arith", "countdown")
    registered = set(tfds.list_builders(with_community_datasets=False))
    assert {"ibpo_arith", "ibpo_countdown"} <= registered
    assert not {"procedural_builder", "ibpo_toy"} & registered
