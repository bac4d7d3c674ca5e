"""One RL step of ibpo_jax vs TRL's GRPOTrainer (GSPO), same model, data and work, one CPU process.

Setting (both sides): a random HF Qwen3 (vocab 80, hidden 256, MLP 768, 4 layers, 8 heads,
4 kv heads, head_dim 32, tied embeddings; torch seed 0) saved once as safetensors and loaded by
both frameworks; the `arith` task's char tokenizer (ours: CharTokenizer; TRL: the same 80 ids as
a PreTrainedTokenizerFast, checked id for id on every prompt); the same 16 prompts per step
(step s's prompts come from the same IndexSampler positions on both sides, checked), G = 8,
64 new tokens, temperature 1, lr 1e-6 (AdamW, constant, grad clip 1.0), beta = 0.01 (k3), fp32.
Prompt width: ours is static, the run's longest prompt (no truncation); TRL pads each batch to
its longest. One optimizer update per rollout batch on both sides, its gradient accumulated
over micro-batches of MICRO_ROWS = 32 rows on both sides (ours: optim.microbatches = 4; TRL:
per_device_train_batch_size 32, gradient_accumulation_steps = steps_per_generation = 4, so it
still generates all 128 completions at once).
One step = sample 128 completions, score them (arith checker -> {-1, +1}), one optimizer update.

- ours: `Trainer.rl_step` with configs/gspo.py and configs/ibpo_gspo.py (ibpo_gspo adds φ). With
  one update per rollout batch its update is a reference log-prob pass + one policy forward /
  backward whose detached log-probs serve as the old ones (+ entropy and diagnostics). Its
  model passes run in `--layout` (optim.layout; default "grouped": each prompt once for its
  G responses; "packed" / "rows" run whole rows, as the TRL side does).
- TRL: `GRPOTrainer` with importance_sampling_level="sequence" (GSPO), loss_type="grpo"
  (sequence mean of token means, as ours), epsilon 3e-4 / 4e-4, group-std scaling, no vLLM,
  use_bias_correction_kl=False (ours does not weight the KL by the ratio), gradient
  checkpointing off (GRPOConfig turns it on by default; ours does not remat), bf16 off. With one
  iteration TRL skips the old-log-prob pass (it reuses the policy forward, detached): its step is
  generate + reference forward + policy forward/backward + AdamW.

Timing: wall clock per step; the first `--warmup` steps of each side are not timed (ours
compiles at step 1); the median of the rest is reported. Compile time is measured exactly, per
step, from jax.monitoring's compile events. TRL is timed with a TrainerCallback (on_step_begin ..
on_step_end) and broken down by wrapping model.generate, the log-prob function (no grad =
reference pass, grad = policy forward), accelerator.backward and the optimizer callbacks.
`--profile` adds a breakdown of our update (rl_step_profile.py): its log-prob passes, forward +
backward, optimizer and one layer's attention, each jitted alone at the last step's shapes, with
XLA's cost analysis (FLOPs, bytes); "update_other" = whole update - its parts (negative when the
fused update is cheaper than the parts run alone). Other processes on the machine distort both
sides, torch's 2-thread generate by far the most (its per-token ops wait on each other's
threads): the JSON records the load average; pin to one core (taskset -c 0) for a
contention-robust check.

Model FLOPs: 2·N per token per forward, 6·N per token for forward + backward, with N = matmul
weights incl. the tied unembedding (norms and the embedding gather are not matmuls; causal
attention scores, left out, would add ~3 %). Only real tokens count: generation counts each prompt's
tokens once plus every generated token; a log-prob pass and the update count prompt + response
tokens of every row. Padding is work but not model FLOPs. MFU = model FLOPs of the timed steps
/ their time / the float32 2048^3 matmul rate of the same framework measured in this run.

    python experiments/benchmarks/bench_rl_step.py [--steps 7] [--warmup 2] [--profile]
        [--algos gspo,ibpo_gspo] [--data-dir DIR] [--quick]   (--quick: 3 steps, 2 warm-up)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
import torch
import transformers

from experiments import host
from ibpo_jax import config as config_lib
from ibpo_jax import rewards
from ibpo_jax.data.sampler import IndexSampler
from ibpo_jax.data.tokenizer import CHARS, SPECIALS, CharTokenizer
from ibpo_jax.runtime import hostmem
from ibpo_jax.trainer.loop import Trainer, build_task

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_model import matmul_gflops  # noqa: E402 - a sibling script
from rl_step_profile import profile_update  # noqa: E402 - a sibling module

REPO = Path(__file__).resolve().parents[2]
# The issue asks for vocab 64; the arith char tokenizer has 80 ids, so the model has 80.
MODEL = dict(vocab_size=len(SPECIALS) + len(CHARS), hidden_size=256, intermediate_size=768,
             num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=32)
PROMPTS, G, NEW_TOKENS, LR, BETA = 16, 8, 64, 1e-6, 0.01
# Forward / backward in micro-batches of this many rows on both sides (gradient accumulation,
# the same gradient): on this CPU a whole 128-row batch spills out of the caches.
MICRO_ROWS = 32
GSPO_EPS = (3e-4, 4e-4)  # configs/base.py's GSPO clip range, given to TRL too
ALGOS = ("gspo", "ibpo_gspo")
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")


def save_random_model(path: Path) -> None:
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(**MODEL, rope_theta=1e6, max_position_embeddings=512,
                                   tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                                   pad_token_id=0)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(path)


def matmul_params(cfg: dict) -> int:
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    n, k, h = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    return cfg["num_hidden_layers"] * (2 * d * n * h + 2 * d * k * h + 3 * d * f) + d * v


def step_flops(n: int, prompt_lens: np.ndarray, response_tokens: int) -> dict[str, float]:
    """Model FLOPs of one step's pieces; prompt_lens: [PROMPTS] (BOS included)."""
    rows = int(prompt_lens.sum()) * G + response_tokens  # prompt + response tokens of all rows
    return {"generate": 2.0 * n * (int(prompt_lens.sum()) + response_tokens),
            "logprob_pass": 2.0 * n * rows, "fwd_bwd": 6.0 * n * rows}


def char_tokenizer_fast() -> transformers.PreTrainedTokenizerFast:
    """CharTokenizer's ids as an HF fast tokenizer: one token per character, <bos> prepended."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate((*SPECIALS, *CHARS))},
                                     unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # characters join without spaces
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A",
                                                       special_tokens=[("<bos>", 1)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>",
                                                bos_token="<bos>", eos_token="<eos>")


def our_config(algo: str, ckpt: Path, data_dir: Path, steps: int,
               max_prompt_len: int = 64, layout: str = "grouped") -> config_lib.RunConfig:
    return config_lib.load(f"{REPO}/configs/{algo}.py:arith_tiny", [
        ("optim.layout", layout),
        ("rollout.max_prompt_len", str(max_prompt_len)),
        ("model.checkpoint", str(ckpt)), ("model.preset", "hf"), ("warm_start.enabled", "false"),
        ("rollout.prompts_per_step", str(PROMPTS)), ("rollout.group_size", str(G)),
        ("rollout.max_new_tokens", str(NEW_TOKENS)), ("rollout.temperature", "1.0"),
        ("optim.lr", str(LR)), ("optim.warmup_steps", "0"), ("loss.beta", str(BETA)),
        ("optim.minibatches", "1"),  # one update per rollout batch, as TRL's num_iterations=1
        ("optim.microbatches", str(PROMPTS * G // MICRO_ROWS)),  # TRL: gradient accumulation
        ("task.data_dir", str(data_dir)), ("train.progress", "false"),
        ("train.steps", str(steps)),
    ])


def _summary(times: list[float], flops: list[float], warmup: int, peak: float) -> dict:
    timed_t, timed_f = times[warmup:], flops[warmup:]
    return {"step_s": statistics.median(timed_t), "step_s_min": min(timed_t),
            "steps_s": [round(t, 3) for t in times],
            "mfu": sum(timed_f) / sum(timed_t) / 1e9 / peak,
            "model_gflop_per_step": statistics.median(timed_f) / 1e9}


# ------------------------------------------------------------------------------ ours


class _CompileClock:
    """Seconds jax spends tracing, lowering and compiling (jax.monitoring events)."""

    def __init__(self):
        self.total = 0.0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event: str, duration: float, **_) -> None:
        if event in _COMPILE_EVENTS:
            self.total += duration


def bench_ours(algo: str, ckpt: Path, data_dir: Path, args, per_step: list[np.ndarray],
               prompt_lens: np.ndarray, peak: float, compiles: _CompileClock,
               profile: bool) -> dict:
    # Static prompt width = the run's longest prompt (TRL pads each batch to its longest).
    cfg = our_config(algo, ckpt, data_dir, args.steps, int(prompt_lens.max()), args.layout)
    n_params = matmul_params(MODEL)
    times, flops, old_pass, compile_s, rows, captured = [], [], [], [], [], {}
    with tempfile.TemporaryDirectory() as work:
        trainer = Trainer(cfg, work, log=lambda *_: None)
        update = trainer.parts.update_fn
        if profile:  # keep the last step's update inputs but the donated state
            def capture(*a):
                captured["args"] = a[1:]
                return update(*a)

        try:
            for s in range(1, args.steps + 1):
                check = IndexSampler(len(trainer.parts.train_records), seed=cfg.seed)
                check.restore(trainer.parts.order.position)
                assert np.array_equal(check.next_indices(PROMPTS), per_step[s - 1]), \
                    "our trainer would draw other prompts than TRL is given"
                if profile and s == args.steps:
                    trainer.parts = dataclasses.replace(trainer.parts, update_fn=capture)
                c0, t0 = compiles.total, time.perf_counter()
                m, _ = trainer.rl_step(s)  # (metrics, record rows)
                times.append(time.perf_counter() - t0)
                compile_s.append(compiles.total - c0)
                rows.append(m)
                f = step_flops(n_params, prompt_lens[s - 1],
                               round(m["response_len_mean"] * PROMPTS * G))
                # Reference pass, plus a separate old-log-prob pass only with several updates.
                passes = 1 if trainer.parts.spec.single_update else 2
                flops.append(f["generate"] + passes * f["logprob_pass"] + f["fwd_bwd"])
                old_pass.append((passes - 1) * f["logprob_pass"])
            prof = (profile_update(trainer, update, trainer.state, *captured["args"])
                    if profile else None)
        finally:
            trainer.close()
    timed = rows[args.warmup:]
    keys = ("time_rollout_s", "time_reward_s", "time_phi_s", "time_update_s")
    out = _summary(times, flops, args.warmup, peak)
    out.update(
        breakdown={k.removeprefix("time_"): statistics.median(r[k] for r in timed)
                   for k in keys},
        compile_s=sum(compile_s), compile_s_per_step=[round(c, 2) for c in compile_s],
        compiled_in_timed_steps=any(c > 0.05 for c in compile_s[args.warmup:]),
        response_len_mean=statistics.mean(r["response_len_mean"] for r in rows),
        accuracy=statistics.mean(r["accuracy"] for r in rows),
    )
    if any(old_pass):  # counting only the work TRL does (no old-log-prob pass) in our time
        out["mfu_without_old_pass"] = _summary(
            times, [f - o for f, o in zip(flops, old_pass)], args.warmup, peak)["mfu"]
    if prof:
        out["update_profile"] = prof
    return out


# ------------------------------------------------------------------------------ TRL


class _Clock:
    """Wall time per label within one step; wraps callables in place."""

    def __init__(self):
        self.t: dict[str, float] = {}

    def add(self, label: str, dt: float) -> None:
        self.t[label] = self.t.get(label, 0.0) + dt

    def wrap(self, fn, label):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(label() if callable(label) else label, time.perf_counter() - t0)

        return timed


def bench_trl(ckpt: Path, records: list[dict], prompt_text, args, prompt_lens: np.ndarray,
              peak: float, workdir: Path) -> dict:
    import datasets
    from trl import GRPOTrainer

    tokenizer = char_tokenizer_fast()
    ours_tok = CharTokenizer()
    for r in records:  # the same ids on both sides, BOS included
        text = prompt_text(r)
        assert tokenizer(text=text)["input_ids"] == [ours_tok.bos_id, *ours_tok.encode(text)]
    reward = rewards.get_reward("arith", values=(-1.0, 1.0))
    clock = _Clock()
    response_tokens: list[int] = []

    def arith_reward(completions, completion_ids, record_index, **_):
        t0 = time.perf_counter()
        out = [reward(records[i], c).reward for i, c in zip(record_index, completions)]
        response_tokens.append(sum(len(ids) for ids in completion_ids))  # EOS included
        clock.add("reward", time.perf_counter() - t0)
        return out

    data = datasets.Dataset.from_list(
        [{"prompt": prompt_text(r), "record_index": i} for i, r in enumerate(records)])
    config = trl_config(args, workdir)
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=arith_reward, args=config,
                          train_dataset=data, processing_class=tokenizer)
    times: list[float] = []
    parts: list[dict[str, float]] = []

    class StepTimer(transformers.TrainerCallback):
        def on_step_begin(self, *_, **__):
            clock.t.clear()
            self.t0 = time.perf_counter()

        def on_pre_optimizer_step(self, *_, **__):
            self.t_opt = time.perf_counter()

        def on_optimizer_step(self, *_, **__):
            clock.add("optimizer", time.perf_counter() - self.t_opt)

        def on_step_end(self, *_, **__):
            times.append(time.perf_counter() - self.t0)
            parts.append(dict(clock.t))

    trainer.add_callback(StepTimer())
    trainer.model.generate = clock.wrap(trainer.model.generate, "generate")
    trainer._get_per_token_logps_and_entropies = clock.wrap(
        trainer._get_per_token_logps_and_entropies,
        lambda: "policy_forward" if torch.is_grad_enabled() else "reference_logprobs")
    trainer.accelerator.backward = clock.wrap(trainer.accelerator.backward, "backward")
    trainer.train()
    return trl_summary(times, parts, response_tokens, args, prompt_lens, peak)


def trl_config(args, workdir: Path):
    """TRL's GRPOConfig: GSPO at the same batch, micro-batches, lr, β and clip range as ours."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(workdir), per_device_train_batch_size=MICRO_ROWS,
        gradient_accumulation_steps=PROMPTS * G // MICRO_ROWS,
        steps_per_generation=PROMPTS * G // MICRO_ROWS, num_iterations=1,
        num_generations=G, max_completion_length=NEW_TOKENS, temperature=1.0, top_p=1.0,
        top_k=0, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, beta=BETA, importance_sampling_level="sequence",
        loss_type="grpo", epsilon=GSPO_EPS[0], epsilon_high=GSPO_EPS[1], scale_rewards="group",
        use_bias_correction_kl=False, gradient_checkpointing=False, bf16=False, fp16=False,
        use_cpu=True, max_steps=args.steps, shuffle_dataset=False, seed=0, report_to="none",
        save_strategy="no", logging_steps=args.steps, disable_dropout=True, disable_tqdm=True,
        dataloader_num_workers=0, remove_unused_columns=False,
    )


def trl_summary(times: list[float], parts: list[dict[str, float]], response_tokens: list[int],
                args, prompt_lens: np.ndarray, peak: float) -> dict:
    """TRL's step times, breakdown and MFU (its reference pass only: no old-log-prob pass)."""
    labels = ("generate", "reward", "reference_logprobs", "policy_forward", "backward",
              "optimizer")
    assert len(times) == len(response_tokens) == args.steps, (len(times), args.steps)
    timed = parts[args.warmup:]
    assert set().union(*timed) <= set(labels), set().union(*timed)
    assert all(p.get("reference_logprobs", 0) > 0 for p in timed), "no reference pass timed"
    n_params = matmul_params(MODEL)
    flops = []
    for s, tokens in enumerate(response_tokens):
        f = step_flops(n_params, prompt_lens[s], tokens)
        flops.append(f["generate"] + f["logprob_pass"] + f["fwd_bwd"])  # reference pass only
    out = _summary(times, flops, args.warmup, peak)
    breakdown = {k: statistics.median(p.get(k, 0.0) for p in timed) for k in labels}
    breakdown["other"] = out["step_s"] - sum(breakdown.values())
    out.update(breakdown=breakdown,
               response_len_mean=sum(response_tokens) / (len(response_tokens) * PROMPTS * G))
    return out


# ------------------------------------------------------------------------------ main


def parse_args() -> tuple[argparse.Namespace, list[str]]:
    """The command line and our configs to run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=7, help="steps per side, warm-up included")
    parser.add_argument("--warmup", type=int, default=2, help="untimed first steps per side")
    parser.add_argument("--algos", default=",".join(ALGOS), help="our configs to run")
    parser.add_argument("--profile", action="store_true", help="also break our update down")
    parser.add_argument("--layout", default="grouped", choices=("grouped", "packed", "rows"),
                        help="our update's optim.layout")
    parser.add_argument("--quick", action="store_true", help="smoke check: 3 steps, 2 warm-up")
    parser.add_argument("--data-dir", default="", help="arith dataset cache (default: a temp dir)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.warmup = 3, 2
    if not 0 < args.warmup < args.steps:
        parser.error("need 0 < --warmup < --steps")
    algos = args.algos.split(",")
    if set(algos) - set(ALGOS):
        parser.error(f"--algos: choose from {ALGOS}")
    return args, algos


def main():
    args, algos = parse_args()
    hostmem.reuse_freed_memory()  # as the entry points do (ibpo_jax/runtime/hostmem.py)
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(cores)  # as many as XLA:CPU, whose pool is left at its default
    compiles = _CompileClock()
    load_before = os.getloadavg()

    # Libraries print progress to stdout; keep stdout for the one JSON line.
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sys.stderr):
        tmp = Path(tmp)
        data_dir = Path(args.data_dir) if args.data_dir else tmp / "data"
        save_random_model(tmp / "model")
        peak = matmul_gflops()
        cfg = our_config(algos[0], tmp / "model", data_dir, args.steps)
        task = build_task(cfg, CharTokenizer(), cfg.task.name, cfg.task.path)
        train = task.split(cfg.task.train_split)
        sampler = IndexSampler(len(train), seed=cfg.seed)  # the one Trainer.rl_step draws from
        per_step = [sampler.next_indices(PROMPTS) for _ in range(args.steps)]
        records = [dict(train[int(i)]) for idx in per_step for i in idx]
        prompt_lens = np.array([1 + len(task.prompt_text(r)) for r in records]  # + BOS
                               ).reshape(args.steps, PROMPTS)
        ours = {a: bench_ours(a, tmp / "model", data_dir, args, per_step, prompt_lens,
                              peak["jax"], compiles, args.profile) for a in algos}
        trl = bench_trl(tmp / "model", records, task.prompt_text, args, prompt_lens,
                        peak["torch"], tmp / "trl")
    print(json.dumps(result(ours, trl, peak, args, cores, load_before)), flush=True)


def result(ours: dict[str, dict], trl: dict, peak: dict[str, float], args, cores: int,
           load_before: tuple[float, float, float]) -> dict:
    """The one JSON line: both sides' times, breakdowns, MFU and the setting they ran in."""
    n_params = matmul_params(MODEL)
    out = {
        "bench": "rl_step",
        "trl_step_s": trl["step_s"],
        "ours_step_s": {a: r["step_s"] for a, r in ours.items()},
        "ratio": {a: trl["step_s"] / r["step_s"] for a, r in ours.items()},
        "ratio_of_min_steps": {a: trl["step_s_min"] / r["step_s_min"] for a, r in ours.items()},
        "ours_breakdown": {a: r["breakdown"] for a, r in ours.items()},
        "trl_breakdown": trl["breakdown"],
        "ours_mfu": {a: r["mfu"] for a, r in ours.items()},
        "ours_mfu_without_old_pass": {a: r["mfu_without_old_pass"] for a, r in ours.items()
                                      if "mfu_without_old_pass" in r},
        "trl_mfu": trl["mfu"],
        "matmul_gflops": peak,
        "flop_limit_s": {  # the timed steps' median model FLOPs at the faster matmul rate
            **{a: r["model_gflop_per_step"] / max(peak.values()) for a, r in ours.items()},
            "trl": trl["model_gflop_per_step"] / max(peak.values())},
        "model_gflop_per_step": {"trl": trl["model_gflop_per_step"],
                                 **{a: r["model_gflop_per_step"] for a, r in ours.items()}},
        "compile_s": {a: r["compile_s"] for a, r in ours.items()},
        "compile_s_per_step": {a: r["compile_s_per_step"] for a, r in ours.items()},
        "steps_s": {"trl": trl["steps_s"], **{a: r["steps_s"] for a, r in ours.items()}},
        "step_s_min": {"trl": trl["step_s_min"], **{a: r["step_s_min"] for a, r in ours.items()}},
        "response_len_mean": {"trl": trl["response_len_mean"],
                              **{a: r["response_len_mean"] for a, r in ours.items()}},
        "setting": {
            "model": {**MODEL, "tie_word_embeddings": True, "matmul_params": n_params},
            "prompts": PROMPTS, "group_size": G, "max_new_tokens": NEW_TOKENS, "lr": LR,
            "beta": BETA, "dtype": "float32", "steps": args.steps, "warmup": args.warmup,
            "ours_layout": args.layout,
            "trl": "importance_sampling_level=sequence, loss_type=grpo, epsilon 3e-4/4e-4, "
                   "scale_rewards=group, use_bias_correction_kl=False, "
                   "gradient_checkpointing=False, num_iterations=1, generation batch 128, "
                   f"micro-batches of {MICRO_ROWS} rows (gradient accumulation)"},
        "flops_formula": "generate 2N(prompt + generated tokens) + update 6N(prompt + response "
                         "tokens of all rows) + 2N(same) per log-prob pass (ours: old + ref; "
                         "TRL: ref only); N = matmul weights incl. tied unembedding",
        "threads": {"cpu": host.cpu_model(), "cpus": os.cpu_count(), "usable_cores": cores,
                    "torch_threads": torch.get_num_threads(),
                    "jax": "XLA:CPU default intra-op thread pool (not capped)",
                    "jax_devices": [str(d) for d in jax.devices()],
                    "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
                    # other processes' load distorts both sides, torch's threads the most
                    "loadavg_1min_start_end": [load_before[0], os.getloadavg()[0]]},
        "versions": {"jax": jax.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__,
                     "trl": __import__("trl").__version__},
        "notes": ["vocab 80 instead of the issue's 64: the arith char tokenizer has 80 ids"],
    }
    for a, r in ours.items():
        if r["compiled_in_timed_steps"]:
            out["notes"].append(f"{a}: jax compiled during a timed step; raise --warmup")
        if "update_profile" in r:
            out.setdefault("ours_update_profile", {})[a] = r["update_profile"]
    return out


if __name__ == "__main__":
    main()
