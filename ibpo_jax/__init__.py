"""ibpo-jax: IBPO (counterfactual trajectory comparison for credit assignment) and token
gradient cancellation for RL of LLM reasoning, in JAX/Flax.

The math lives in ``comparison`` (φ), ``advantages``, ``losses`` and ``cancellation``;
``docs/DESIGN.md`` is the specification they cite (section numbers "DESIGN §n").
"""

__version__ = "0.1.0"
