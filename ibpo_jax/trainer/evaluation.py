"""Held-out evaluation: avg@k (mean accuracy over k samples) and pass@k of a policy.

Prompts are processed in fixed-size chunks (the last one padded by repeating a prompt) so the
sampler compiles once; the key is fixed, so evaluations at different steps see the same draws.
With `progress`, a bar (the trainer's style: tqdm on stderr, process 0) counts the problems
done and shows the ETA and the running accuracy: at 8,192 new tokens a chunk takes minutes.
With `shown`, the first sample of the first few problems is kept for people to read (the run's
samples.jsonl and TensorBoard text).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import tqdm

from ibpo_jax.runtime.sharding import host_array
from ibpo_jax.trainer.batching import decode_responses, encode_prompts, score_shared

EVAL_KEY = 0x5EED  # evaluation draws do not depend on the training step or seed


def evaluate(generate: Any, params: Any, *, records: Sequence[dict], task: Any, tokenizer: Any,
             pool: Any, samples: int, chunk: int, max_prompt_len: int,
             second: Callable[[list[dict], list[str], Any], np.ndarray] | None = None,
             progress: bool = False, desc: str = "eval", leave: bool = False,
             shown: tuple[int, list[dict]] | None = None) -> dict[str, float]:
    """Scores `samples` responses per record; returns eval_accuracy (avg@k), eval_pass_at_k,
    eval_response_len and eval_entropy (mean per-token entropy at temperature 1, the sampler's).

    generate: a `sampling.generate_fn(..., num_samples=samples)` function; chunk: prompts per
    call. second: for methods whose answer is a second attempt (SCoRe), (records, first-attempt
    texts, key) -> whether each second attempt is correct; the second attempts are then the
    scored answers and the first attempts' accuracy is eval_accuracy_attempt1. progress: show
    the bar, labelled `desc`; `leave`: keep it on screen when done (inside a run, it goes).
    shown: (n, out): appends to `out` the first sample of the first n problems (`sample_rows`).
    """
    correct = np.zeros((len(records), samples), bool)
    first = np.zeros((len(records), samples), bool)
    lengths, entropy, key = [], [], jax.random.key(EVAL_KEY)  # entropy: Σ per row

    def run_chunk(start: int) -> int:
        """Samples and scores records[start: start + chunk]; returns how many are real."""
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
        ent = getattr(out, "entropy", None)  # (hand-built outputs may have none)
        entropy.append(ent if ent is None else host_array(ent)[:keep])
        if shown is not None and start < shown[0]:
            picked = list(range(0, min(n_real, shown[0] - start) * samples, samples))
            shown[1].extend(sample_rows(task, pool, [rows[i] for i in picked],
                                        [texts[i] for i in picked]))
        return n_real

    # Every chunk is shown (mininterval 0): one takes minutes at long response lengths.
    with tqdm.tqdm(total=len(records), desc=desc, unit="problem", dynamic_ncols=True,
                   file=sys.stderr, leave=leave, mininterval=0,
                   disable=not progress or jax.process_index() != 0) as bar:
        for start in range(0, len(records), chunk):
            done = start + run_chunk(start)
            bar.set_postfix(acc=f"{correct[:done].mean():.3f}", refresh=False)
            bar.update(done - bar.n)
    return _summary(correct, first if second is not None else None, lengths, entropy)


def _summary(correct: np.ndarray, first: np.ndarray | None, lengths: list[np.ndarray],
             entropy: list[np.ndarray | None]) -> dict[str, float]:
    """`evaluate`'s metrics from its per-sample correctness [n, k] (first attempts': `first`),
    the responses' lengths and summed entropies (chunk by chunk)."""
    out = {
        "eval_accuracy": float(correct.mean()),
        f"eval_pass_at_{correct.shape[1]}": float(correct.any(axis=1).mean()),
        "eval_response_len": float(np.concatenate(lengths).mean()),
    }
    if all(e is not None for e in entropy):  # token mean over every evaluated response
        out["eval_entropy"] = float(np.concatenate(entropy).sum() / np.concatenate(lengths).sum())
    if first is not None:
        out["eval_accuracy_attempt1"] = float(first.mean())
    return out


def sample_rows(task: Any, pool: Any, records: Sequence[dict], texts: Sequence[str]
                ) -> list[dict]:
    """What people read of evaluation responses: prompt, response, reward, correct and, for a
    wrong one whose checker reports it (arith), the true first wrong step. Re-scores these few
    locally: the shared scoring keeps only rewards and correctness."""
    reward, infos = pool.score(list(records), list(texts))
    out = []
    for record, text, r, info in zip(records, texts, reward, infos):
        row = {"prompt": task.prompt_text(record), "response": text, "reward": float(r),
               "correct": bool(info["correct"])}
        if not row["correct"] and info.get("first_wrong_step") is not None:
            row["first_wrong_step"] = int(info["first_wrong_step"])
        out.append(row)
    return out


def problems(cfg: Any, task: Any, split: str) -> list[dict]:
    """The problems evaluated: the first config.eval.num_prompts of the task's split."""
    records = task.split(split)
    return [records[i] for i in range(min(cfg.eval.num_prompts, len(records)))]


def chunk_size(cfg: Any) -> int:
    """Prompts per evaluation sampler call: as many rows as a rollout's (B·G), at least one
    prompt."""
    return max(1, cfg.rows_per_step // cfg.eval.samples)


def run(cfg: Any, generate: Any, params: Any, *, records: Sequence[dict], task: Any,
        tokenizer: Any, pool: Any,
        second: Callable[[list[dict], list[str], Any], np.ndarray] | None = None,
        desc: str = "eval", leave: bool = False, shown: list[dict] | None = None
        ) -> dict[str, float]:
    """`evaluate` with a run's settings (`cfg`, a RunConfig): config.eval.samples samples per
    problem, `chunk_size` prompts per call, prompts cut at config.rollout.max_prompt_len, the
    bar per config.train.progress. generate: the run's evaluation sampler
    (`batching.sampler(..., evaluation=True)`). shown: receives config.logging.samples
    samples (`sample_rows`)."""
    return evaluate(generate, params, records=records, task=task, tokenizer=tokenizer,
                    pool=pool, samples=cfg.eval.samples, chunk=chunk_size(cfg),
                    max_prompt_len=cfg.rollout.max_prompt_len, second=second,
                    progress=cfg.train.progress, desc=desc, leave=leave,
                    shown=None if shown is None else (cfg.logging.samples, shown))
