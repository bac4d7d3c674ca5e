"""`arith` as a tensorflow_datasets builder in array_record format, readable without TensorFlow.

tfds 4.9 builds `GeneratorBasedBuilder`s with file_format="array_record" and reads them back with
`builder.as_data_source()` / `tfds.data_source(...)` using only numpy and the array_record
package, so TensorFlow is never imported. Built on first use into the data dir
($IBPO_DATA_DIR, default ~/.cache/ibpo_jax/tfds) as

    <data_dir>/ibpo_arith/<config name>/1.0.0/{dataset_info.json, features.json,
        ibpo_arith-{train,validation,test}.array_record-00000-of-00001}

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
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow_datasets as tfds
from absl import logging as absl_logging

from ibpo_jax.data import arith
from ibpo_jax.registry import UnknownSplitError

SPLIT_SEEDS = {"test": 1, "validation": 2, "train": 3}


def default_data_dir() -> str:
    return os.environ.get("IBPO_DATA_DIR") or os.path.expanduser("~/.cache/ibpo_jax/tfds")


@dataclasses.dataclass(eq=False)
class ArithBuilderConfig(tfds.core.BuilderConfig):
    """One `arith` dataset: difficulty, split sizes and seed (all part of the config name)."""

    arith: arith.ArithConfig = dataclasses.field(default_factory=arith.ArithConfig)
    num_train: int = 20000
    num_validation: int = 500
    num_test: int = 500
    seed: int = 0

    @classmethod
    def make(cls, config: arith.ArithConfig | str = "level3", *, num_train: int = 20000,
             num_validation: int = 500, num_test: int = 500,
             seed: int = 0) -> ArithBuilderConfig:
        """Config for a LADDER level name or an ArithConfig; the name encodes every field."""
        if isinstance(config, str):
            if config not in arith.LADDER:
                raise ValueError(f"unknown arith level {config!r}; valid: {sorted(arith.LADDER)}")
            config = arith.LADDER[config]
        op_names = "".join({"+": "a", "-": "s", "*": "m", "/": "d"}[o] for o in config.ops)
        name = (f"n{config.num_steps}_d{config.digits}_{op_names}_max{config.max_value}"
                f"_mul{config.mul_max}_{num_train}-{num_validation}-{num_test}_seed{seed}")
        return cls(name=name, version="1.0.0", arith=config, num_train=num_train,
                   num_validation=num_validation, num_test=num_test, seed=seed)

    def split_sizes(self) -> dict[str, int]:
        return {"test": self.num_test, "validation": self.num_validation, "train": self.num_train}


class IbpoArith(tfds.core.GeneratorBasedBuilder):
    """Procedural step-verifiable arithmetic chains (see ibpo_jax.data.arith)."""

    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [ArithBuilderConfig.make(level) for level in arith.LADDER]

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
        # No download checksums to look up next to the code. tfds's default lookup for a builder
        # inside a package imports the `importlib_resources` backport, which we do not need.
        return None

    def _info(self) -> tfds.core.DatasetInfo:
        features = tfds.features.FeaturesDict({
            "id": tfds.features.Text(),
            "question": tfds.features.Text(),
            "reference": tfds.features.Text(),
            "start": np.int64,
            "ops": tfds.features.Text(),
            "operands": tfds.features.Sequence(np.int64),
            "answer": np.int64,
        })
        return tfds.core.DatasetInfo(builder=self, features=features,
                                     description=arith.__doc__.split("\n")[0])

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        cfg: ArithBuilderConfig = self.builder_config
        splits, seen = {}, set()
        for split, n in cfg.split_sizes().items():
            records = arith.generate(cfg.arith, cfg.seed * 1000 + SPLIT_SEEDS[split], n,
                                     exclude=seen, id_prefix=f"{split}/")
            seen.update(r["question"] for r in records)
            splits[split] = self._generate_examples(records)
        return splits

    def _generate_examples(self, records: Sequence[dict]):
        for r in records:
            yield r["id"], r


@contextlib.contextmanager
def _quiet_tfds():
    """tfds warns about every non-ladder config ("custom data configuration") and about the
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


def _make_builder(config: ArithBuilderConfig, data_dir: str) -> IbpoArith:
    # tfds refuses a custom config object named like a predefined one (a ladder level), even an
    # equal one; the name encodes every field, so the predefined object is the same config.
    config = IbpoArith.builder_configs.get(config.name, config)
    with _quiet_tfds(), _scratch_tempdir():
        return IbpoArith(config=config, data_dir=data_dir, file_format="array_record")


def build(config: ArithBuilderConfig, data_dir: str | None = None) -> IbpoArith:
    """The prepared builder for `config`, preparing it first if needed (atomic, see module doc)."""
    return prepare_atomically(lambda d: _make_builder(config, d), data_dir or default_data_dir(),
                              prefix=".ibpo_arith-incomplete-")


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


class ArithSource:
    """Random-access view of one split as plain-dict records (str, int and list[int] values)."""

    def __init__(self, data_source, split: str):
        self._source = data_source
        self.split = split

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: int) -> dict:
        n = len(self._source)
        if not -n <= index < n:
            raise IndexError(f"arith {self.split} index {index} out of range for {n} records")
        raw = self._source[index % n]
        return {
            "id": raw["id"].decode(),
            "question": raw["question"].decode(),
            "reference": raw["reference"].decode(),
            "start": int(raw["start"]),
            "ops": raw["ops"].decode(),
            "operands": [int(x) for x in raw["operands"]],
            "answer": int(raw["answer"]),
        }


def load_split(config: ArithBuilderConfig, split: str, data_dir: str | None = None) -> ArithSource:
    """One split ("train", "validation" or "test"), building the dataset on first use."""
    sources = build(config, data_dir).as_data_source()
    if split not in sources:
        raise UnknownSplitError(f"arith has no split {split!r}; valid: {sorted(sources)}")
    return ArithSource(sources[split], split)
