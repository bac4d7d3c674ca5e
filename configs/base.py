"""Algorithms and presets of every training config, as data (big_vision style).

Each file in ``configs/`` is ``get_config(arg=None)`` choosing an algorithm and calling
``make(algo, preset=arg)``. ``arg`` is the preset name given as ``--config=configs/x.py:preset``
(default ``arith_tiny``). The keys, their defaults, documentation and checks live in one place,
the section dataclasses that ``ibpo_jax/config/run.py`` assembles (a default that depends on the
algorithm, such as the clip range of each loss, is resolved by its section): the ConfigDict here
is generated from ``config.defaults()``, and algorithms and presets are dicts of dotted-key
overrides.
"""

from __future__ import annotations

import ml_collections

from ibpo_jax import config

# Algorithm = base optimizer x comparison operator (DESIGN §4: IBPO is any optimizer with φ on).
ALGOS = {
    "ibpo_gspo": {"loss.name": "gspo", "ibpo.operator": "lcs_first_error"},
    "gspo": {"loss.name": "gspo", "ibpo.operator": "terminal"},
    "grpo": {"loss.name": "grpo", "ibpo.operator": "terminal"},
    "ibpo_grpo": {"loss.name": "grpo", "ibpo.operator": "lcs_first_error"},
    "ppo": {"loss.name": "ppo", "ibpo.operator": "terminal"},
    "ibpo_ppo": {"loss.name": "ppo", "ibpo.operator": "lcs_first_error"},
    # Table 1's other baselines (DESIGN §7): GSPO on R + λ_prm · min_k PRM_k, and GRPO with
    # SCoRe's second attempts.
    "prm_gspo": {"loss.name": "gspo", "ibpo.operator": "terminal", "prm.weight": 0.5},
    # SCoRe's second attempts need a base that reads second-attempt prompts (README).
    "score_grpo": {"loss.name": "grpo", "ibpo.operator": "terminal", "score.enabled": True,
                   "warm_start.followups": True},
}

# Embedded task + tiny Qwen3 on 2 CPU cores: warm start, then RL, in about 10 minutes. The task
# (3 steps, 1-digit operands, + - *) is hard enough that the warm-started base solves about
# half the problems when sampling (room for RL) and easy enough to warm-start in a few
# minutes. 32 prompts x G 8 per step, four minibatch updates per rollout batch, lr 3e-5:
# higher rates (1e-4) fit each step's prompts and lose held-out accuracy, smaller batches gain
# less per step (README, "Tuning the default"). Held-out accuracy is avg@8 of sampled answers
# (temperature 1), the paper's avg@k.
ARITH_TINY = {
    "warm_start.enabled": True,
    "rollout.prompts_per_step": 32, "rollout.max_new_tokens": 48,
    "train.steps": 200, "train.eval_every": 50, "train.checkpoint_every": 50,
    "optim.lr": 3e-5, "optim.minibatches": 4, "loss.beta": 0.01,
    "eval.num_prompts": 500, "eval.samples": 8, "eval.temperature": 1.0,
    # Appendix A's policy-gradient variance at steps 1, 20, 40, ... (trainer/pg_variance.py).
    "diagnostics.grad_var_every": 20,
}

# The long-horizon task (README, "The long task"): 8-step chains, where one local slip sinks an
# otherwise right answer, the situation Appendix A says IBPO is for. Prompts are 103
# characters on average (at most 131), responses 74 (at most 87). The base after 500
# warm-start steps solves 15-40 % (sampled avg@8), the range aimed at: 33 % on the Intel
# host that calibrated it (3 % after 400 steps, 82 % after 800: README, "The long task"),
# 24 % for the base committed in experiments/warm_starts/. 200 RL steps (about 15 min on 2
# cores): in 100, neither GSPO nor IBPO moved the legacy base; in 200 both gain ~8 points.
ARITH_LONG = {
    **ARITH_TINY,
    "task.arith.num_steps": 8, "rollout.max_prompt_len": 136, "rollout.max_new_tokens": 96,
    "warm_start.steps": 500,
    "train.steps": 200, "train.eval_every": 50, "train.checkpoint_every": 50,
    "eval.num_prompts": 300,
}

# The task with many right paths (issue #48, docs/data.md "The countdown task"): reach a target
# from 4-6 numbers, each problem with >= 3 distinct shortest solutions, the warm start on a
# random one per problem (data/countdown.py). Prompts are at most 29 characters, references 45.
# The committed base (2,400 warm-start steps) solves 20 % (sampled avg@8 on 500 validation
# prompts); 800 steps gave 8 %, 1,600 15 % (200 prompts).
COUNTDOWN = {
    **ARITH_TINY,
    "task.name": "countdown", "rollout.max_prompt_len": 32, "rollout.max_new_tokens": 48,
    "warm_start.steps": 2400,
}

# Seconds-long run for tests: a smaller model and batch, a few steps. The 800-step warm start
# (about 30 s, cached in the data dir) makes the base solve about a third of the problems, so
# groups are mixed and φ and the advantages are not all zero: the tests exercise the credit
# path, not a no-op. Evaluation samples like the rollout (same shapes and settings), so the run
# compiles one sampler.
SMOKE = {
    **ARITH_TINY,
    "model.tiny.hidden_size": 64, "model.tiny.intermediate_size": 192,
    "model.tiny.num_hidden_layers": 2, "model.tiny.num_attention_heads": 4,
    "model.tiny.num_key_value_heads": 2, "model.tiny.head_dim": 16,
    "rollout.prompts_per_step": 4, "rollout.group_size": 4, "rollout.max_new_tokens": 40,
    "optim.minibatches": 1,
    "warm_start.steps": 800, "warm_start.warmup_steps": 50, "warm_start.batch_size": 32,
    "train.steps": 4, "train.eval_every": 2, "train.checkpoint_every": 2,
    "train.progress": False, "diagnostics.grad_var_every": 0,
    "prm.num_prompts": 4, "prm.samples": 2, "prm.completions": 2, "prm.head_steps": 100,
    "score.stage1_steps": 2, "warm_start.followups": False,  # the smoke base, shared
    "eval.num_prompts": 4, "eval.samples": 4, "eval.temperature": 1.0,
}

# Your checkpoint and your JSONL on one device, small (README, "Your own model and data"):
# --config.model.checkpoint=DIR --config.task.path=train.jsonl --config.task.eval_path=test.jsonl
# and nothing else. 8 prompts x G 4 per step, 256-token prompts and responses, 20 steps, greedy
# evaluation of 32 problems: minutes on CPU with a tiny model; the paper's lengths and batch
# are the qwen3_*_math presets. Renamed columns: --config.task.fields=question:prompt,...
LOCAL = {
    "task.name": "math_jsonl", "task.thinking": False, "model.preset": "hf",
    "rollout.prompts_per_step": 8, "rollout.group_size": 4, "rollout.max_prompt_len": 256,
    "rollout.max_new_tokens": 256, "reward.num_workers": 2,
    "train.steps": 20, "train.eval_every": 10, "train.checkpoint_every": 10,
    "eval.num_prompts": 32, "eval.samples": 1,
}

# The paper's setting (§4.1): lr 1e-6, β 0.01, G 8, λ 0.5, 400 steps, on Qwen3-<size>;
# --config.task.path=/data/deepscaler.jsonl --config.task.eval_path=/data/math500/test.jsonl.
# Memory (docs/plan.md, DESIGN §9): remat "full" (each row keeps one layer input per layer for
# the backward pass), 256-position logit chunks, linear-memory attention (model.attention
# "auto": cudnn / splash / chunked), parameters and Adam moments sharded over every device
# (mesh.fsdp=-1), micro-batches and sampler calls sized per model below.
QWEN3_MATH = {
    "task.name": "math_jsonl", "task.eval_name": "math500", "task.thinking": False,
    "model.dtype": "bfloat16", "model.param_dtype": "float32", "model.remat": "full",
    "model.scan_layers": True, "model.logits_chunk": 256,
    "rollout.prompts_per_step": 128, "rollout.group_size": 8, "rollout.max_prompt_len": 1024,
    "rollout.max_new_tokens": 8192, "rollout.temperature": 1.0,
    "reward.num_workers": 16, "optim.lr": 1e-6, "mesh.data": 1, "mesh.fsdp": -1,
    "train.steps": 400, "train.eval_every": 50, "train.checkpoint_every": 25,
    "eval.num_prompts": 500, "eval.samples": 8, "eval.temperature": 0.6, "eval.top_p": 0.95,
}
# Qwen3 size -> (hardware, devices) each preset is sized for, and (mesh.tensor, rows per batch
# device in a gradient micro-batch, prompts per sampler call): the plan (`python -m
# ibpo_jax.plan --config=configs/ibpo_gspo.py:qwen3_<size>_math --hardware=<hardware>
# --devices=<devices>`) compiles one RL step for it; docs/plan.md has its figures. mesh.fsdp
# fills the devices. The rows per device (optim.micro_batch_rows) give the micro-batch count
# on the named hardware (128 prompts x G 8 = 1,024 rows an update), and a valid one when a
# user shrinks the batch (e.g. 4 prompts: one micro-batch).
#
# | preset           | hardware            | tensor | rows / device | micro-batches | chunk |
# |------------------|---------------------|--------|---------------|---------------|-------|
# | qwen3_0.6b_math  | 1 x H100 80 GB      | 1      | 16            | 64            | 4     |
# | qwen3_1.7b_math  | 1 x H100 80 GB      | 1      | 8             | 128           | 2     |
# | qwen3_4b_math    | 8 x H100 80 GB      | 1      | 8             | 16            | 8     |
# | qwen3_8b_math    | 8 x H100 80 GB      | 1      | 4             | 32            | 8     |
# | qwen3_14b_math   | 8 x A100 80 GB      | 2      | 2             | 128           | 2     |
# | qwen3_32b_math   | 32 x A100 80 GB     | 4      | 1             | 128           | 4     |
#
# 32B does not fit 8 x 80 GB: fp32 weights, Adam moments, gradients and their accumulator
# alone are 16 bytes per parameter, 65 GB per device over 8 (the plan: the update needs 163 GiB
# per device); 32 x 80 GB is the smallest count planned that fits (docs/plan.md).
QWEN3_HARDWARE = {"0.6b": ("h100", 1), "1.7b": ("h100", 1), "4b": ("h100", 8),
                  "8b": ("h100", 8), "14b": ("a100", 8), "32b": ("a100", 32)}
_QWEN3_SIZES = {"0.6b": (1, 16, 4), "1.7b": (1, 8, 2), "4b": (1, 8, 8), "8b": (1, 4, 8),
                "14b": (2, 2, 2), "32b": (4, 1, 4)}

# Settings of one algorithm under one preset, applied last. SCoRe on arith_tiny: 50 steps of
# 32 prompts x G 8 x 2 attempts = 25,600 trajectories (GSPO's 100 steps, Table 1's budget),
# the first 15 in stage I: its default stage I of 50 steps would fill the whole run.
# SCoRe logs no Appendix A variance diagnostic: its operator is terminal (φ = 0), so the
# diagnostic's IBPO-vs-GSPO comparison is empty, and over two attempts it cost 25 s a time.
_SCORE_TINY = {"train.steps": 50, "score.stage1_steps": 15, "train.eval_every": 25,
               "train.checkpoint_every": 25, "diagnostics.grad_var_every": 0}
ALGO_PRESETS = {("score_grpo", "arith_tiny"): _SCORE_TINY,
                ("score_grpo", "arith_long"): _SCORE_TINY,
                ("score_grpo", "countdown"): _SCORE_TINY}  # countdown: arith_tiny's budget

PRESETS = {
    "arith_tiny": ARITH_TINY,
    "arith_long": ARITH_LONG,
    "countdown": COUNTDOWN,
    "smoke": SMOKE,
    "local": LOCAL,
    **{f"qwen3_{size}_math": {**QWEN3_MATH, "model.preset": f"qwen3-{size}",
                              "mesh.tensor": tensor, "optim.micro_batch_rows": rows,
                              "rollout.sample_chunk": chunk}
       for size, (tensor, rows, chunk) in _QWEN3_SIZES.items()},
}


def make(algo: str, preset: str | None = None) -> ml_collections.ConfigDict:
    """The config of `algo` (a key of ALGOS) under `preset` (a key of PRESETS)."""
    if algo not in ALGOS:
        raise ValueError(f"unknown algorithm {algo!r}; valid: {', '.join(ALGOS)}")
    preset = preset or "arith_tiny"
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; valid: {', '.join(PRESETS)}")
    c = ml_collections.ConfigDict(config.defaults())
    for key, value in {"algo": algo, "preset": preset, **ALGOS[algo], **PRESETS[preset],
                       **ALGO_PRESETS.get((algo, preset), {})}.items():
        *parents, leaf = key.split(".")
        node = c
        for part in parents:
            node = node[part]
        node[leaf] = value
    return c
