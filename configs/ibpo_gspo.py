"""IBPO on GSPO, the paper's method: GSPO's sequence-ratio objective with the shaped
advantage R + λφ, φ from the LCS first-error operator (eq. 5, DESIGN §2-§4).

Usage: python -m ibpo_jax.train --config=configs/ibpo_gspo.py[:preset] [--config.key=value ...]
Presets: arith_tiny (default), smoke, qwen3_{0.6b,1.7b,4b,8b,14b,32b}_math.
"""

from configs import base


def get_config(arg=None):
    return base.make("ibpo_gspo", preset=arg)
