"""Procedural tasks (`arith`, `countdown`) as tensorflow_datasets builders in array_record format,
readable without TensorFlow.

tfds 4.9 builds `GeneratorBasedBuilder`s with file_format="array_record" and reads them back with
`builder.as_data_source()` / `tfds.data_source(...)` using only numpy and the array_record
package, so TensorFlow is never imported. A task subclasses `ProceduralBuilder` (its features,
description, generator and predefined configs) and `ProceduralBuilderConfig` (how a config is
named); this module builds it on first use into the data dir ($IBPO_DATA_DIR, default
~/.cache/ibpo_jax/tfds) as

    <data_dir>/ibpo_<task>/<config name>/1.0.0/{dataset_info.json, features.json,
        ibpo_<task>-{train,validation,test}.array_record-00000-of-00001}

Concurrency: `build` prepares the dataset in a private temporary data dir and moves the finished
version directory into place with one rename(2), which is atomic. Two processes building at
once both finish; the first rename wins and the loser discards its copy, so readers only ever
see a complete dataset.

Splits: test, then validation, then train are drawn from independent seeds derived from the
config's seed, each excluding the questions of the splits drawn before it, so they are disjoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import tensorflow_datasets as tfds
from absl import logging as absl_logging

from ibpo_jax.config.registry import UnknownSplitError

SPLIT_SEEDS = {"test": 1, "validation": 2, "train": 3}
VERSION = "1.0.0"


def default_data_dir() -> str:
    return os.environ.get("IBPO_DATA_DIR") or os.path.expanduser("~/.cache/ibpo_jax/tfds")


@dataclasses.dataclass(eq=False)
class ProceduralBuilderConfig(tfds.core.BuilderConfig):
    """One dataset of a procedural task: the generator's config `problem`, split sizes and seed
    (all part of the config name). A task's subclass adds a `make` that names it."""

    problem: Any = None
    num_train: int = 10000
    num_validation: int = 500
    num_test: int = 500
    seed: int = 0

    @classmethod
    def named(cls, stem: str, problem: Any, *, num_train: int, num_validation: int,
              num_test: int, seed: int) -> ProceduralBuilderConfig:
        """The config "<stem>_<train>-<validation>-<test>_seed<seed>"; `stem` must encode every
        field of `problem`, so that equal names mean equal datasets."""
        name = f"{stem}_{num_train}-{num_validation}-{num_test}_seed{seed}"
        return cls(name=name, version=VERSION, problem=problem, num_train=num_train,
                   num_validation=num_validation, num_test=num_test, seed=seed)

    def split_sizes(self) -> dict[str, int]:
        return {"test": self.num_test, "validation": self.num_validation, "train": self.num_train}


class ProceduralBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A procedural task's builder. Subclasses (registered with tfds under their snake-case
    class name, e.g. IbpoArith -> "ibpo_arith") declare:

    FEATURES: record key -> tfds feature, in the records' key order, for the keys after the
      ones every procedural record starts with: "id", "question", "reference" (text).
    DESCRIPTION: one line stored in dataset_info.json.
    generate(problem, seed, n, *, exclude, id_prefix) -> records (as `arith.generate`).
    BUILDER_CONFIGS: the predefined configs.
    """

    VERSION = tfds.core.Version(VERSION)
    FEATURES: ClassVar[dict[str, Any]] = {}
    DESCRIPTION: ClassVar[str] = ""
    generate: ClassVar[Callable[..., list[dict]]]

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
        # No download checksums to look up next to the code. tfds's default lookup for a builder
        # inside a package imports the `importlib_resources` backport, which we do not need.
        return None

    @classmethod
    def task_name(cls) -> str:
        return cls.name.removeprefix("ibpo_")

    @classmethod
    def features(cls) -> dict[str, Any]:
        """Every feature of a record, in the records' key order."""
        text = tfds.features.Text
        return {"id": text(), "question": text(), "reference": text(), **cls.FEATURES}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            self.features()), description=self.DESCRIPTION)

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        cfg: ProceduralBuilderConfig = self.builder_config
        splits, seen = {}, set()
        for split, n in cfg.split_sizes().items():
            records = self.generate(cfg.problem, cfg.seed * 1000 + SPLIT_SEEDS[split], n,
                                    exclude=seen, id_prefix=f"{split}/")
            seen.update(r["question"] for r in records)
            splits[split] = self._generate_examples(records)
        return splits

    def _generate_examples(self, records: Sequence[dict]):
        for r in records:
            yield r["id"], r


@contextlib.contextmanager
def _quiet_tfds():
    """tfds warns about every non-predefined config ("custom data configuration") and about the
    not-yet-built variant folder; both are expected here."""
    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)
    try:
        yield
    finally:
        absl_logging.set_verbosity(verbosity)


@contextlib.contextmanager
def _scratch_tempdir():
    """A builder of a not-yet-prepared dataset makes an empty temporary directory (tfds's
    DatasetInfo.initialize_from_bucket) and never removes it; make it inside one we remove."""
    old = tempfile.tempdir
    with tempfile.TemporaryDirectory(prefix="ibpo-tfds-") as scratch:
        tempfile.tempdir = scratch
        try:
            yield
        finally:
            tempfile.tempdir = old


def _make_builder(builder_cls: type[ProceduralBuilder], config: ProceduralBuilderConfig,
                  data_dir: str) -> ProceduralBuilder:
    # tfds refuses a custom config object named like a predefined one, even an equal one; the
    # name encodes every field, so the predefined object is the same config.
    config = builder_cls.builder_configs.get(config.name, config)
    with _quiet_tfds(), _scratch_tempdir():
        return builder_cls(config=config, data_dir=data_dir, file_format="array_record")


def build(builder_cls: type[ProceduralBuilder], config: ProceduralBuilderConfig,
          data_dir: str | None = None) -> ProceduralBuilder:
    """The prepared builder for `config`, preparing it first if needed (atomic, see module doc)."""
    return prepare_atomically(functools.partial(_make_builder, builder_cls, config),
                              data_dir or default_data_dir(),
                              prefix=f".{builder_cls.name}-incomplete-")


def prepare_atomically(make_builder: Callable[[str], Any], data_dir: str, *, prefix: str) -> Any:
    """`make_builder(data_dir)` prepared: built in a private directory under `data_dir`, then one
    atomic rename into place (a concurrent build that finished first wins)."""
    builder = make_builder(data_dir)
    with _quiet_tfds():
        prepared = builder.is_prepared()
    if prepared:
        return builder
    os.makedirs(data_dir, exist_ok=True)
    tmp_dir = tempfile.mkdtemp(prefix=prefix, dir=data_dir)
    try:
        tmp_builder = make_builder(tmp_dir)
        tfds.disable_progress_bar()  # a one-second build; keep the run's log clean
        tmp_builder.download_and_prepare()
        final = os.fspath(builder.data_path)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        try:
            os.rename(os.fspath(tmp_builder.data_path), final)
        except OSError:
            if not make_builder(data_dir).is_prepared():
                raise  # not a lost race: something else is in the way
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return make_builder(data_dir)


class RecordSource:
    """Random-access view of one split as plain-dict records, decoded by feature type: Text as
    str, the numeric features as Python ints and lists of ints (numpy's `tolist`)."""

    def __init__(self, data_source, split: str, *, task: str, features: dict[str, Any]):
        self._source = data_source
        self.split = split
        self.task = task
        # (key, is text) in the declared order, so records keep the generator's key order.
        self._keys = tuple((k, isinstance(f, tfds.features.Text)) for k, f in features.items())

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: int) -> dict:
        n = len(self._source)
        if not -n <= index < n:
            raise IndexError(f"{self.task} {self.split} index {index} out of range for {n} "
                             "records")
        raw = self._source[index % n]
        return {k: raw[k].decode() if text else np.asarray(raw[k]).tolist()
                for k, text in self._keys}


def load_split(builder_cls: type[ProceduralBuilder], config: ProceduralBuilderConfig,
               split: str, data_dir: str | None = None) -> RecordSource:
    """One split ("train", "validation" or "test"), building the dataset on first use."""
    sources = build(builder_cls, config, data_dir).as_data_source()
    task = builder_cls.task_name()
    if split not in sources:
        raise UnknownSplitError(f"{task} has no split {split!r}; valid: {sorted(sources)}")
    return RecordSource(sources[split], split, task=task, features=builder_cls.features())
