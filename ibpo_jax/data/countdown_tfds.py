"""`countdown` as a tensorflow_datasets builder in array_record format, readable without
TensorFlow (the same layout, atomic first build and disjoint split seeds as `arith_tfds`):

    <data_dir>/ibpo_countdown/<config name>/1.0.0/{dataset_info.json, features.json,
        ibpo_countdown-{train,validation,test}.array_record-00000-of-00001}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import tensorflow_datasets as tfds

from ibpo_jax.data import countdown
from ibpo_jax.data.arith_tfds import (
    SPLIT_SEEDS,
    _quiet_tfds,
    _scratch_tempdir,
    default_data_dir,
    prepare_atomically,
)
from ibpo_jax.registry import UnknownSplitError


@dataclasses.dataclass(eq=False)
class CountdownBuilderConfig(tfds.core.BuilderConfig):
    """One `countdown` dataset: difficulty, split sizes and seed (all part of the name)."""

    countdown: countdown.CountdownConfig = dataclasses.field(
        default_factory=countdown.CountdownConfig)
    num_train: int = 10000
    num_validation: int = 500
    num_test: int = 500
    seed: int = 0

    @classmethod
    def make(cls, config: countdown.CountdownConfig | None = None, *, num_train: int = 10000,
             num_validation: int = 500, num_test: int = 500,
             seed: int = 0) -> CountdownBuilderConfig:
        """Config for `config` (default CountdownConfig()); the name encodes every field."""
        c = config or countdown.CountdownConfig()
        name = (f"n{c.min_numbers}-{c.max_numbers}_x{c.max_number}_max{c.max_value}"
                f"_t{c.min_target}_k{c.min_solutions}"
                f"_{num_train}-{num_validation}-{num_test}_seed{seed}")
        return cls(name=name, version="1.0.0", countdown=c, num_train=num_train,
                   num_validation=num_validation, num_test=num_test, seed=seed)

    def split_sizes(self) -> dict[str, int]:
        return {"test": self.num_test, "validation": self.num_validation, "train": self.num_train}


class IbpoCountdown(tfds.core.GeneratorBasedBuilder):
    """Procedural countdown problems with several right solutions (ibpo_jax.data.countdown)."""

    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [CountdownBuilderConfig.make()]

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
        return None  # no download checksums to look up (see arith_tfds.IbpoArith.code_path)

    def _info(self) -> tfds.core.DatasetInfo:
        features = tfds.features.FeaturesDict({
            "id": tfds.features.Text(),
            "question": tfds.features.Text(),
            "reference": tfds.features.Text(),
            "numbers": tfds.features.Sequence(np.int64),
            "target": np.int64,
            "max_value": np.int64,
            "num_steps": np.int64,
            "num_solutions": np.int64,
            "num_solutions_all": np.int64,
        })
        return tfds.core.DatasetInfo(builder=self, features=features,
                                     description=countdown.__doc__.split("\n")[0])

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        cfg: CountdownBuilderConfig = self.builder_config
        splits, seen = {}, set()
        for split, n in cfg.split_sizes().items():
            records = countdown.generate(cfg.countdown, cfg.seed * 1000 + SPLIT_SEEDS[split], n,
                                         exclude=seen, id_prefix=f"{split}/")
            seen.update(r["question"] for r in records)
            splits[split] = self._generate_examples(records)
        return splits

    def _generate_examples(self, records: Sequence[dict]):
        for r in records:
            yield r["id"], r


def _make_builder(config: CountdownBuilderConfig, data_dir: str) -> IbpoCountdown:
    # tfds refuses a custom config object named like a predefined one, even an equal one.
    config = IbpoCountdown.builder_configs.get(config.name, config)
    with _quiet_tfds(), _scratch_tempdir():
        return IbpoCountdown(config=config, data_dir=data_dir, file_format="array_record")


def build(config: CountdownBuilderConfig, data_dir: str | None = None) -> IbpoCountdown:
    """The prepared builder for `config`, preparing it first if needed (atomically, as arith's)."""
    return prepare_atomically(lambda d: _make_builder(config, d), data_dir or default_data_dir(),
                              prefix=".ibpo_countdown-incomplete-")


class CountdownSource:
    """Random-access view of one split as plain-dict records (str, int and list[int] values)."""

    def __init__(self, data_source, split: str):
        self._source = data_source
        self.split = split

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: int) -> dict:
        n = len(self._source)
        if not -n <= index < n:
            raise IndexError(f"countdown {self.split} index {index} out of range for {n} records")
        raw = self._source[index % n]
        return {
            "id": raw["id"].decode(),
            "question": raw["question"].decode(),
            "reference": raw["reference"].decode(),
            "numbers": [int(x) for x in raw["numbers"]],
            "target": int(raw["target"]),
            "max_value": int(raw["max_value"]),
            "num_steps": int(raw["num_steps"]),
            "num_solutions": int(raw["num_solutions"]),
            "num_solutions_all": int(raw["num_solutions_all"]),
        }


def load_split(config: CountdownBuilderConfig, split: str,
               data_dir: str | None = None) -> CountdownSource:
    """One split ("train", "validation" or "test"), building the dataset on first use."""
    sources = build(config, data_dir).as_data_source()
    if split not in sources:
        raise UnknownSplitError(f"countdown has no split {split!r}; valid: {sorted(sources)}")
    return CountdownSource(sources[split], split)
