"""What `accelerator_check.py` measures with: the model FLOPs and decode bytes it divides by
(DESIGN §9), a compile counter, and the trainer (`loop.Trainer`) on random weights of the
preset's architecture, with stand-ins for what needs files (tokenizer, prompts).

The stand-ins, and only these: prompts are random token ids filling every prompt column; the
tokenizer maps ids to private-use characters one to one (ids = 0 mod 24 are the step delimiter
and decode to a newline, ~24 tokens per step, as `RunParts.is_delim` would mark lines); rows have
no EOS id (a random model would rarely sample one, and every row then runs all the new tokens:
the step at its full shapes); and correctness, after the preset's own verifier has scored the
decoded text (random text is never right), is a seeded draw, half of each group right, so φ and
the advantages have their real work.
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
import time
from typing import Any

import jax
import numpy as np

from ibpo_jax import models
from ibpo_jax.config import RunConfig
from ibpo_jax.data.tasks import Task
from ibpo_jax.runtime import sharding
from ibpo_jax.trainer import collect as collect_lib
from ibpo_jax.trainer import loop, step
from ibpo_jax.trainer import parts as parts_lib

DELIM_EVERY = 24  # stand-in step delimiter: token ids = 0 mod 24
_CHAR0 = 0xE000  # private-use plane start: id i <-> chr(_CHAR0 + i), no surrogates

# ------------------------------------------------------------------ model FLOPs and bytes

FLOPS_NOTE = ("model FLOPs: 2N per forward token, 6N per trained token (N = matmul weights incl. "
              "the unembedding) + causal attention 4*L*heads*head_dim per (query, visible key) "
              "forward, x3 with backward; remat recomputation and padding not counted")


def matmul_params(c: models.Qwen3Config) -> int:
    """Weights that multiply activations: q/k/v/o, the MLP, and the unembedding."""
    d, f, v = c.hidden_size, c.intermediate_size, c.vocab_size
    n, k, h = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    return c.num_hidden_layers * (2 * d * n * h + 2 * d * k * h + 3 * d * f) + d * v


def attention_fwd_flops(c: models.Qwen3Config, before: Any, length: Any) -> float:
    """Forward causal-attention FLOPs of `length` queries that follow `before` earlier tokens
    (query j sees before + j keys; QK^T and AV, 2 FLOPs per multiply-add each); arrays sum."""
    before, length = np.asarray(before, np.float64), np.asarray(length, np.float64)
    pairs = length * before + length * (length + 1) / 2
    return float(4 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * pairs.sum())


def forward_flops(cfg: RunConfig, c: models.Qwen3Config, plen: np.ndarray,
                  rlen: np.ndarray) -> float:
    """One frozen forward over a rollout's rows [N] as the update runs it: each prompt once per
    group in the "grouped" layout, once per row otherwise."""
    heads = plen[::cfg.rollout.group_size] if cfg.update_layout == "grouped" else plen
    return (2.0 * matmul_params(c) * float(heads.sum() + rlen.sum())
            + attention_fwd_flops(c, 0, heads) + attention_fwd_flops(c, plen, rlen))


def update_flops(cfg: RunConfig, c: models.Qwen3Config, plen: np.ndarray,
                 rlen: np.ndarray) -> float:
    """`step.update`'s model passes: a reference forward (β > 0), a π_old forward (several
    updates per rollout), and per epoch a forward + backward of every row."""
    single = cfg.optim.epochs * cfg.optim.minibatches == 1 and cfg.loss.name != "ppo"
    frozen = (cfg.loss.beta > 0) + (not single)
    return forward_flops(cfg, c, plen, rlen) * (frozen + 3 * cfg.optim.epochs)


def generate_flops(c: models.Qwen3Config, plen: np.ndarray, rlen: np.ndarray,
                   group: int) -> float:
    """The sampler: each prompt's prefill once per group, then 2N per generated token of every
    row plus its attention over the prompt and the tokens before it."""
    heads = plen[::group]
    return (2.0 * matmul_params(c) * float(heads.sum() + rlen.sum())
            + attention_fwd_flops(c, 0, heads) + attention_fwd_flops(c, plen, rlen))


def kv_bytes_per_token(c: models.Qwen3Config, itemsize: int) -> int:
    """DESIGN §9: keys and values of every layer, per token of one row."""
    return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * itemsize


def decode_bytes(c: models.Qwen3Config, itemsize: int, plen: np.ndarray,
                 rlen: np.ndarray) -> dict[str, float]:
    """DESIGN §9's decode roofline: each decode step reads the sampling weights once and every
    row's filled KV cache. Row r's decode step j (1 .. len_r - 1; its first token comes from the
    prefill) reads plen_r + j tokens of cache; the weights are read at each of max(len) - 1
    steps."""
    steps = max(int(rlen.max()) - 1, 0)
    j = np.maximum(rlen.astype(np.float64) - 1, 0)
    filled = float(np.sum(j * plen + j * (j + 1) / 2))  # Σ_r Σ_j (plen_r + j)
    weights = float(c.num_params()) * itemsize
    kv = filled * kv_bytes_per_token(c, itemsize)
    return {"decode_steps": steps, "weight_bytes_per_step": weights,
            "weight_bytes": weights * steps, "kv_bytes": kv, "total_bytes": weights * steps + kv}


# ------------------------------------------------------------------ compilations


class CompileCounter:
    """Counts XLA compilations (and sums trace + lower + compile seconds) through
    `jax.monitoring`'s duration events, between marks."""

    TRACE = "/jax/core/compile/jaxpr_trace_duration"
    LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
    COMPILE = "/jax/core/compile/backend_compile_duration"

    def __init__(self):
        self.events: list[tuple[str, float, str]] = []
        jax.monitoring.register_event_duration_secs_listener(self)

    def __call__(self, event: str, duration: float, **kwargs: Any) -> None:
        if event in (self.TRACE, self.LOWER, self.COMPILE):
            self.events.append((event, float(duration), str(kwargs.get("fun_name", "?"))))

    def mark(self) -> int:
        return len(self.events)

    def since(self, mark: int) -> dict[str, Any]:
        new = self.events[mark:]
        compiled = [name for event, _, name in new if event == self.COMPILE]
        return {"compiles": len(compiled), "seconds": sum(d for _, d, _ in new),
                "compiled": sorted(set(compiled))}


# ------------------------------------------------------------------ the trainer, stand-ins


class StandInTokenizer:
    """Ids <-> private-use characters, one to one; ids = 0 mod DELIM_EVERY decode to "\\n"."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.eos_ids: tuple[int, ...] = ()
        self.pad_id, self.bos_id = 0, None
        self.is_delim = np.arange(vocab_size) % DELIM_EVERY == 0

    def encode(self, text: str) -> list[int]:
        return [ord(ch) - _CHAR0 for ch in text]

    def decode(self, ids: list[int]) -> str:
        return "".join("\n" if i % DELIM_EVERY == 0 else chr(_CHAR0 + i) for i in ids)


def stand_in_task(vocab: int, prompt_len: int, n: int, seed: int) -> Task:
    """`n` records of `prompt_len` random non-delimiter tokens each, scored by the preset
    task's verifier ("math")."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, (n, prompt_len))
    ids = np.where(ids % DELIM_EVERY == 0, ids + 1, ids) % vocab
    records = [{"prompt": "".join(chr(_CHAR0 + int(i)) for i in row), "answer": "42",
                "question": ""} for row in ids]
    return Task(name="stand_in", reward="math", splits={"train": lambda: records,
                                                        "validation": lambda: records[:1]},
                prompt_fn=lambda r: r["prompt"], reference_fn=lambda r: None)


@dataclasses.dataclass(frozen=True)
class DrawnCollector(collect_lib.Collector):
    """The trainer's collector whose verifier is followed by a seeded correctness draw
    (module docstring): random weights answer nothing right, and all-wrong groups would
    leave the update no signal."""

    rng: np.random.Generator | None = None

    def score(self, records, tokens, lengths):
        """The preset's verifier on the decoded rows (timed as the reward phase), then about
        half of each group drawn correct."""
        reward, correct, ended, infos = super().score(records, tokens, lengths)
        g = self.cfg.rollout.group_size
        draw = np.stack([self.rng.permutation(g) < max(1, g // 2)
                         for _ in range(len(lengths) // g)])
        correct = draw.reshape(-1)[: len(lengths)]
        reward = np.where(correct, self.cfg.reward.correct, self.cfg.reward.wrong)
        return reward.astype(np.float32), correct, ended, infos


class BenchTrainer(loop.Trainer):
    """`loop.Trainer` on random weights with the stand-ins above; `rl_step` is the trainer's
    own. Each phase's device program is wrapped to note the device memory after it, the
    update's wrapper first scores the rollout with the policy (`score`, the update's frozen
    forward on its own) for the sampler-vs-trainer log-prob mismatch, and the collector's
    verifier is followed by the seeded correctness draw (`DrawnCollector`)."""

    def __init__(self, cfg: RunConfig, counter: CompileCounter, seed: int = 0):
        tokenizer_of = lambda c, vocab_size=None: StandInTokenizer(self._vocab)  # noqa: E731
        self._vocab = models.QWEN3_PRESETS[cfg.model.preset].vocab_size \
            if cfg.model.preset != "tiny" else 256
        n = max(4 * cfg.rollout.prompts_per_step, 8)
        task = stand_in_task(self._vocab, cfg.rollout.max_prompt_len, n, seed)
        patched = {"build_tokenizer": tokenizer_of,
                   "train_and_eval_tasks": lambda c, t: (task, task, "validation")}
        saved = {k: getattr(parts_lib, k) for k in patched}
        make_mesh = sharding.make_mesh
        self._workdir = tempfile.TemporaryDirectory(prefix="accelerator_check_")
        try:  # the Trainer's own constructor, with the stand-ins in place of files, on one chip
            for k, v in patched.items():
                setattr(parts_lib, k, v)
            sharding.make_mesh = functools.partial(make_mesh, devices=jax.devices()[:1])
            super().__init__(cfg, self._workdir.name, log=lambda *_: None)
        finally:
            sharding.make_mesh = make_mesh
            for k, v in saved.items():
                setattr(parts_lib, k, v)
        self.device = jax.devices()[0]
        self.memory: dict[str, int] = {}  # phase -> peak_bytes_in_use after it (cumulative)
        self.last: dict[str, Any] = {}  # this step's score time, mismatch, lengths, compiles
        self.counter = counter
        run = self.parts
        self.score_fn = jax.jit(functools.partial(_policy_logprobs, run.spec))
        # Compiled-program caches, to show the programs did not multiply over the steps.
        self.jitted = {"sampler_prefill": getattr(run.generate, "prefill", None),
                       "credit": run.credit_fn, "update": run.update_fn, "score": self.score_fn}
        generate = self._noted("sample", run.generate)
        run.schedule.placement.sampler = generate  # what a step's collect samples with
        fields = {f.name: getattr(run.collector, f.name)
                  for f in dataclasses.fields(run.collector)}
        self.parts = dataclasses.replace(
            run, generate=generate, credit_fn=self._noted("phi", run.credit_fn),
            update_fn=self._scored(self._noted("update", run.update_fn)),
            collector=DrawnCollector(**fields, rng=np.random.default_rng(seed + 1)))

    def _note(self, phase: str) -> None:
        stats = self.device.memory_stats()
        if stats and "peak_bytes_in_use" in stats:
            self.memory[phase] = int(stats["peak_bytes_in_use"])

    def _noted(self, phase: str, fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            mark = self.counter.mark()
            out = jax.block_until_ready(fn(*args, **kwargs))
            self._note(phase)
            self.last.setdefault("compiles", {})[phase] = self.counter.since(mark)
            return out
        wrapped.__dict__.update(getattr(fn, "__dict__", {}))  # e.g. the sampler's `weights`
        return wrapped

    def cache_sizes(self) -> dict[str, int]:
        return {k: int(f._cache_size()) for k, f in self.jitted.items()
                if hasattr(f, "_cache_size")}

    def _scored(self, update: Any) -> Any:
        def wrapped(state, ref_params, rollout, cred, key, plan):
            t0, mark = time.perf_counter(), self.counter.mark()
            logp = jax.block_until_ready(self.score_fn(state.params, rollout, cred, plan))
            self.last["score_s"] = time.perf_counter() - t0
            self.last.setdefault("compiles", {})["score"] = self.counter.since(mark)
            self._note("score")
            self.last["mismatch"] = mismatch(rollout, logp)
            self.last["rlen"] = sharding.host_array(rollout.response_len)
            self.last["plen"] = sharding.host_array(rollout.prompt_len)
            self.last["extra_s"] = time.perf_counter() - t0  # all of this is not the update's
            return update(state, ref_params, rollout, cred, key, plan)
        return wrapped

    def close(self) -> None:
        super().close()
        self._workdir.cleanup()


def _policy_logprobs(spec: step.StepSpec, params: Any, rollout: step.Rollout,
                     cred: step.Credit, plan: Any) -> jax.Array:
    """[N, R] the trainer's log-probs of the sampled tokens under `params`: the update's own
    frozen pass (`step.prepare_batch`'s reference forward, here with the policy's weights)."""
    import dataclasses

    spec = dataclasses.replace(spec, loss=dataclasses.replace(spec.loss, beta=1.0))
    state = step.TrainState(params, None, None)
    return step.prepare_batch(spec, state, params, rollout, cred, plan)[0].ref_logp


def mismatch(rollout: step.Rollout, trainer_logp: jax.Array) -> dict[str, float]:
    """Sampler vs trainer log-probs of the same response tokens: |Δ| mean and max, and the
    importance ratio exp(Δ), Δ = trainer - sampler (what π / π_old starts at in the update)."""
    mask = np.asarray(step.response_mask(rollout.response_len, rollout.response.shape[1]))
    d = (np.asarray(trainer_logp, np.float64) - np.asarray(rollout.sample_logp, np.float64))[mask]
    ratio = np.exp(d)
    return {"tokens": int(mask.sum()), "mean_abs": float(np.mean(np.abs(d))),
            "max_abs": float(np.max(np.abs(d))), "mean": float(np.mean(d)),
            "ratio_mean": float(ratio.mean()), "ratio_std": float(ratio.std()),
            "ratio_min": float(ratio.min()), "ratio_max": float(ratio.max()),
            "ratio_outside_0.8_1.25": float(np.mean((ratio < 0.8) | (ratio > 1.25)))}
