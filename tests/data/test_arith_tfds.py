"""The arith TFDS builder: array_record without TensorFlow, plain records, disjoint
deterministic splits, concurrent first builds, and the `arith` task on top of it."""

import importlib.util
import multiprocessing as mp
import os

import pytest
import tensorflow_datasets as tfds

from ibpo_jax.data import arith, arith_tfds, get_task, procedural_tfds
from tests.data.test_procedural_tfds import check_plain_splits

SMALL = dict(num_train=300, num_validation=40, num_test=40, seed=0)


def build(config, data_dir):
    return procedural_tfds.build(arith_tfds.IbpoArith, config, data_dir)


def load_split(config, split, data_dir):
    return procedural_tfds.load_split(arith_tfds.IbpoArith, config, split, data_dir)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("tfds"))
    config = arith_tfds.ArithBuilderConfig.make("level2", **SMALL)
    return config, data_dir, build(config, data_dir)


def test_tensorflow_is_not_installed_and_files_are_array_record(built):
    config, data_dir, builder = built
    assert importlib.util.find_spec("tensorflow") is None
    files = sorted(os.listdir(builder.data_path))
    assert [f for f in files if "array_record" in f] == [
        f"ibpo_arith-{s}.array_record-00000-of-00001" for s in ("test", "train", "validation")]
    assert not [d for d in os.listdir(data_dir) if "incomplete" in d]  # temp dir cleaned


def test_building_leaves_no_temporary_directories(tmp_path, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))  # the process's temp root
    config = arith_tfds.ArithBuilderConfig.make("level2", **{**SMALL, "seed": 1})
    build(config, str(tmp_path / "data"))
    build(config, str(tmp_path / "data"))  # prepared: reopened
    assert os.listdir(scratch) == []


def test_splits_sizes_types_and_disjointness(built):
    config, data_dir, _ = built
    splits = {s: load_split(config, s, data_dir) for s in ("train", "validation", "test")}
    record = check_plain_splits(splits, {"train": 300, "validation": 40, "test": 40}, {
        "id": str, "question": str, "reference": str, "start": int, "ops": str,
        "operands": list, "answer": int})
    assert all(type(x) is int for x in record["operands"])
    assert arith.check(record["reference"], record).correct


def test_tfds_data_source_reads_it_and_rebuilds_are_identical(built, tmp_path):
    config, data_dir, _ = built
    sources = tfds.data_source("ibpo_arith", data_dir=data_dir,
                               builder_kwargs={"config": config})
    raw = sources["validation"][5]
    assert load_split(config, "validation", data_dir)[5]["question"] == raw["question"].decode()
    other = load_split(config, "validation", str(tmp_path))
    assert [other[i] for i in range(40)] == [
        load_split(config, "validation", data_dir)[i] for i in range(40)]


def _build_in_process(data_dir):
    config = arith_tfds.ArithBuilderConfig.make("level1", num_train=2000, num_validation=50,
                                                num_test=50, seed=4)
    source = load_split(config, "train", data_dir)
    return len(source), source[0]["id"]


def test_two_processes_building_at_once_both_succeed(tmp_path):
    with mp.get_context("spawn").Pool(2) as pool:
        results = pool.map(_build_in_process, [str(tmp_path)] * 2)
    assert results[0] == results[1] and results[0][0] == 2000
    assert os.listdir(tmp_path) == ["ibpo_arith"]  # no half-built leftovers
    assert len(os.listdir(tmp_path / "ibpo_arith")) == 1


def test_arith_task(built):
    config, data_dir, _ = built
    task = get_task("arith", config="level2", data_dir=data_dir, **SMALL)
    assert (task.name, task.reward) == ("arith", "arith")
    record = task.split("test")[0]
    assert task.prompt_text(record) == record["question"] + "\n"
    assert task.reference_text(record) == record["reference"]
    with pytest.raises(ValueError, match="no split 'dev'"):
        task.split("dev")
    with pytest.raises(ValueError, match="unknown arith level 'level9'"):
        get_task("arith", config="level9")
