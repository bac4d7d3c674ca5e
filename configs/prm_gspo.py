"""PRM+GSPO baseline (Table 1, DESIGN §7): GSPO on r̃ = R + λ_prm · min_k PRM_k, the process
reward model a frozen copy of the base policy with a scalar head at step ends, fitted before RL
on Monte-Carlo labels (whose rollouts count in budget_trajectories).

Usage: python -m ibpo_jax.train --config=configs/prm_gspo.py[:preset] [--config.key=value ...]
Presets: arith_tiny (default), smoke, qwen3_{0.6b,1.7b,4b,8b,14b,32b}_math.
"""

from configs import base


def get_config(arg=None):
    return base.make("prm_gspo", preset=arg)
