"""PPO baseline: clipped policy + clipped value loss on a value head, GAE (γ = 1).

Usage: python -m ibpo_jax.train --config=configs/ppo.py[:preset] [--config.key=value ...]
Presets: arith_tiny (default), smoke, qwen3_{0.6b,1.7b,4b,8b,14b,32b}_math.
"""

from configs import base


def get_config(arg=None):
    return base.make("ppo", preset=arg)
