"""Held-out evaluation: avg@k (mean accuracy over k samples) and pass@k of a policy.

Prompts are processed in fixed-size chunks (the last one padded by repeating a prompt) so the
sampler compiles once; the key is fixed, so evaluations at different steps see the same draws.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from ibpo_jax.sharding import host_array
from ibpo_jax.trainer.batching import decode_responses, encode_prompts, score_shared

EVAL_KEY = 0x5EED  # evaluation draws do not depend on the training step or seed


def evaluate(generate: Any, params: Any, *, records: Sequence[dict], task: Any, tokenizer: Any,
             pool: Any, samples: int, chunk: int, max_prompt_len: int,
             second: Callable[[list[dict], list[str], Any], np.ndarray] | None = None
             ) -> dict[str, float]:
    """Scores `samples` responses per record; returns eval_accuracy (avg@k) and eval_pass_at_k.

    generate: a `sampling.generate_fn(..., num_samples=samples)` function; chunk: prompts per
    call. second: for methods whose answer is a second attempt (SCoRe), (records, first-attempt
    texts, key) -> whether each second attempt is correct; the second attempts are then the
    scored answers and the first attempts' accuracy is eval_accuracy_attempt1.
    """
    correct = np.zeros((len(records), samples), bool)
    first = np.zeros((len(records), samples), bool)
    lengths = []
    key = jax.random.key(EVAL_KEY)
    for start in range(0, len(records), chunk):
        part = list(records[start: start + chunk])
        n_real = len(part)
        part += [part[-1]] * (chunk - n_real)
        prompts = encode_prompts(tokenizer, [task.prompt_text(r) for r in part], max_prompt_len)
        out = generate(params, prompts.tokens, prompts.lengths, jax.random.fold_in(key, start))
        tokens, lens = host_array(out.tokens), host_array(out.lengths)
        keep = n_real * samples  # rows are prompt-major
        texts = decode_responses(tokenizer, tokens[:keep], lens[:keep])
        rows = [r for r in part[:n_real] for _ in range(samples)]
        first[start: start + n_real] = score_shared(pool, rows, texts)[1].reshape(n_real, samples)
        correct[start: start + n_real] = first[start: start + n_real] if second is None else (
            second(rows, texts, jax.random.fold_in(key, start + (1 << 20))).reshape(-1, samples))
        lengths.append(lens[:keep])
    out = {
        "eval_accuracy": float(correct.mean()),
        f"eval_pass_at_{samples}": float(correct.any(axis=1).mean()),
        "eval_response_len": float(np.concatenate(lengths).mean()),
    }
    if second is not None:
        out["eval_accuracy_attempt1"] = float(first.mean())
    return out
