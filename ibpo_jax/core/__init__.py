"""The math of the RL step, with no knowledge of how a run is configured (DESIGN §2-§5):
φ and its LCS kernels (`comparison`, `_bitparallel`, `_tiling`), comparison units (`units`),
advantage estimators (`advantages`), policy losses and their aggregation (`losses`), KL
estimators (`kl`), token gradient cancellation (`cancellation`) and safe numerics
(`numerics`). Keyword-only pure functions on arrays, each citing its equation; they import
nothing above `ibpo_jax.config.registry`, where they register their names.
"""
