"""`arith` as a procedural TFDS builder (array_record, no TensorFlow; see procedural_tfds):

    <data_dir>/ibpo_arith/<config name>/1.0.0/{dataset_info.json, features.json,
        ibpo_arith-{train,validation,test}.array_record-00000-of-00001}

Read a split with `procedural_tfds.load_split(IbpoArith, ArithBuilderConfig.make(...), split)`.
"""

from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

from ibpo_jax.data import arith
from ibpo_jax.data.procedural_tfds import ProceduralBuilder, ProceduralBuilderConfig


class ArithBuilderConfig(ProceduralBuilderConfig):
    """One `arith` dataset: `problem` is its ArithConfig."""

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
        stem = (f"n{config.num_steps}_d{config.digits}_{op_names}_max{config.max_value}"
                f"_mul{config.mul_max}")
        return cls.named(stem, config, num_train=num_train, num_validation=num_validation,
                         num_test=num_test, seed=seed)


class IbpoArith(ProceduralBuilder):
    """Procedural step-verifiable arithmetic chains (see ibpo_jax.data.arith)."""

    BUILDER_CONFIGS = [ArithBuilderConfig.make(level) for level in arith.LADDER]
    FEATURES = {
        "start": np.int64,
        "ops": tfds.features.Text(),
        "operands": tfds.features.Sequence(np.int64),
        "answer": np.int64,
    }
    DESCRIPTION = arith.__doc__.split("\n")[0]
    generate = staticmethod(arith.generate)
