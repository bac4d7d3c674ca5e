"""PRM+GSPO (Table 1, DESIGN §7): GSPO on r̃ = R + λ_prm · min_k PRM_k.

`config` (the `prm` section), `model` (the PRM: a frozen copy of the base with a scalar head at
step ends), `labels` (its Monte-Carlo step labels) and `method` (the registered method: fits the
PRM before RL, then shapes every step's rewards). Nothing is imported here, so that the config
can import its section alone.
"""
