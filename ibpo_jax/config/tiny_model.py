"""The `model.tiny` config section: `models.Qwen3Config`'s own fields (less the two the run
sets), so that the tiny model's architecture is set from the command line with the model's
own checks. Its own module, to keep `config/sections.py` small."""

from __future__ import annotations

import dataclasses

from ibpo_jax.config.schema import ConfigError, Section
from ibpo_jax.models import config as model_config

# The tiny model's section: `models.Qwen3Config`'s fields less the two the run sets
# (vocab_size from the tokenizer, max_position_embeddings from the rollout lengths).
_RUN_SET = ("vocab_size", "max_position_embeddings")
_TINY = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, rope_theta=10_000.0, tie_word_embeddings=True)


def _check_tiny(self) -> None:
    """models.Qwen3Config's own checks (heads, head_dim, ...), named as config keys."""
    try:
        model_config.Qwen3Config(vocab_size=1, max_position_embeddings=1,
                                 **dataclasses.asdict(self))
    except model_config.ArchitectureError as e:
        raise ConfigError(f"config.model.tiny: {e}") from None


TinyModelConfig = dataclasses.make_dataclass(
    "TinyModelConfig",
    [(f.name, f.type, dataclasses.field(default=_TINY.get(f.name, f.default)))
     for f in dataclasses.fields(model_config.Qwen3Config) if f.name not in _RUN_SET],
    bases=(Section,), frozen=True,
    namespace={"KEY": "model.tiny", "__module__": __name__, "check": _check_tiny,
               "__doc__": "models.Qwen3Config of preset 'tiny' (less the fields the run sets)"})
