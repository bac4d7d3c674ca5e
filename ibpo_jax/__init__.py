"""ibpo-jax: IBPO (counterfactual trajectory comparison for credit assignment) and token
gradient cancellation for RL of LLM reasoning, in JAX/Flax.

The math lives in ``comparison`` (φ), ``advantages``, ``losses`` and ``cancellation``;
``../DESIGN.md`` (shipped as ``docs/DESIGN.md``) is the specification they cite.
"""

__version__ = "0.1.0"
