"""IBPO on GRPO (paper Table C.4): GRPO's token-clipped objective with R + λφ.

Usage: python -m ibpo_jax.train --config=configs/ibpo_grpo.py[:preset] [--config.key=value ...]
Presets: arith_tiny (default), smoke, qwen3_{0.6b,1.7b,4b,8b,14b,32b}_math.
"""

from configs import base


def get_config(arg=None):
    return base.make("ibpo_grpo", preset=arg)
