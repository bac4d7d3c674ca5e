"""IBPO on PPO (paper Table C.4): the shaped terminal reward R + λφ fed to GAE.

Usage: python -m ibpo_jax.train --config=configs/ibpo_ppo.py[:preset] [--config.key=value ...]
Presets: arith_tiny (default), smoke, qwen3_{0.6b,1.7b,4b,8b,14b,32b}_math.
"""

from configs import base


def get_config(arg=None):
    return base.make("ibpo_ppo", preset=arg)
