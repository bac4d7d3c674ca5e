"""SCoRe+GRPO baseline (Table 1, DESIGN §7): two attempts per sample, the second prompted with
the problem, the first attempt and a fixed self-correction instruction; stage I trains the
second attempt with a strong KL anchor on the first, stage II both, with the bonus
α · (r(y₂) − r(y₁)); GRPO advantages within each attempt's group.

Usage: python -m ibpo_jax.train --config=configs/score_grpo.py[:preset] [--config.key=value ...]
Presets: arith_tiny (default), smoke, qwen3_{0.6b,1.7b,4b,8b,14b,32b}_math.
"""

from configs import base


def get_config(arg=None):
    return base.make("score_grpo", preset=arg)
