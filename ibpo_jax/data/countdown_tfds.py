"""`countdown` as a procedural TFDS builder (array_record, no TensorFlow; see procedural_tfds):

    <data_dir>/ibpo_countdown/<config name>/1.0.0/{dataset_info.json, features.json,
        ibpo_countdown-{train,validation,test}.array_record-00000-of-00001}
"""

from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

from ibpo_jax.data import countdown
from ibpo_jax.data.procedural_tfds import ProceduralBuilder, ProceduralBuilderConfig


class CountdownBuilderConfig(ProceduralBuilderConfig):
    """One `countdown` dataset: `problem` is its CountdownConfig."""

    @classmethod
    def make(cls, config: countdown.CountdownConfig | None = None, *,
             num_train: int = countdown.NUM_TRAIN,
             num_validation: int = 500, num_test: int = 500,
             seed: int = 0) -> CountdownBuilderConfig:
        """Config for `config` (default CountdownConfig()); the name encodes every field."""
        c = config or countdown.CountdownConfig()
        stem = (f"n{c.min_numbers}-{c.max_numbers}_x{c.max_number}_max{c.max_value}"
                f"_t{c.min_target}_k{c.min_solutions}")
        return cls.named(stem, c, num_train=num_train, num_validation=num_validation,
                         num_test=num_test, seed=seed)


class IbpoCountdown(ProceduralBuilder):
    """Procedural countdown problems with several right solutions (ibpo_jax.data.countdown)."""

    BUILDER_CONFIGS = [CountdownBuilderConfig.make()]
    FEATURES = {
        "numbers": tfds.features.Sequence(np.int64),
        "target": np.int64,
        "max_value": np.int64,
        "num_steps": np.int64,
        "num_solutions": np.int64,
        "num_solutions_all": np.int64,
    }
    DESCRIPTION = countdown.__doc__.split("\n")[0]
    generate = staticmethod(countdown.generate)
