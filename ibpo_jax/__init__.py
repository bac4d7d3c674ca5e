"""ibpo-jax: IBPO (counterfactual trajectory comparison for credit assignment) and token
gradient cancellation for RL of LLM reasoning, in JAX/Flax.

The packages are the boxes of one RL step, lowest layer first (an import only points down,
tests/test_imports.py):

    core/      the math: φ and its kernels, units, advantages, losses, KL, cancellation
    runtime/   meshes and sharding, host memory, accelerator facts, how entry points end
    models/    the Qwen3 model, its KV cache, LoRA, HF checkpoints
    sampler/   autoregressive sampling and its strategies (collect)
    data/      tasks, datasets, tokenizers;  rewards/  the checkers (score)
    config/    the typed, frozen run configuration and the name registries
    trainer/   the RL step and the loop around it;  plan/  what a run needs, ahead of time
    methods/   plug-in methods on the trainer's hooks (corrections, PRM, SCoRe)

Entry points: ``python -m ibpo_jax.train``, ``python -m ibpo_jax.evaluate``,
``python -m ibpo_jax.plan``, ``python -m ibpo_jax.trainer.plot``. ``docs/DESIGN.md`` is the
specification the math cites (section numbers "DESIGN §n").
"""

__version__ = "0.1.0"
