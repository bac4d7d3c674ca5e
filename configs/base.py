"""Shared defaults and presets of every training config (big_vision style).

Each file in ``configs/`` is ``get_config(arg=None)`` choosing an algorithm and calling
``make(algo, preset=arg)``. ``arg`` is the preset name given as ``--config=configs/x.py:preset``
(default ``arith_tiny``). Every key below is typed and validated in one place,
``ibpo_jax/config.py``, which turns this ConfigDict into frozen dataclasses; nothing below the
trainer reads ml_collections.
"""

from __future__ import annotations

import ml_collections

# Algorithm = base optimizer x comparison operator (DESIGN §4: IBPO is any optimizer with φ on).
ALGOS = {
    "ibpo_gspo": dict(loss="gspo", operator="lcs_first_error"),
    "gspo": dict(loss="gspo", operator="terminal"),
    "grpo": dict(loss="grpo", operator="terminal"),
    "ibpo_grpo": dict(loss="grpo", operator="lcs_first_error"),
    "ppo": dict(loss="ppo", operator="terminal"),
    "ibpo_ppo": dict(loss="ppo", operator="lcs_first_error"),
}

# Paper-scale presets: Qwen3 size -> (mesh, micro-batches per update). The mesh is a default
# for one multi-host slice; override with --config.mesh.fsdp=... to fit your hardware.
_QWEN3_SIZES = {
    "0.6b": dict(fsdp=8, tensor=1, microbatches=2),
    "1.7b": dict(fsdp=8, tensor=1, microbatches=4),
    "4b": dict(fsdp=16, tensor=1, microbatches=4),
    "8b": dict(fsdp=16, tensor=2, microbatches=8),
    "14b": dict(fsdp=16, tensor=4, microbatches=8),
    "32b": dict(fsdp=32, tensor=4, microbatches=16),
}
PRESETS = ("arith_tiny", "smoke", *(f"qwen3_{size}_math" for size in _QWEN3_SIZES))


def base() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0

    c.task = dict(
        name="arith",  # a registry.TASKS name
        path="",  # local file or directory for file-backed tasks (math_jsonl, math500, ...)
        data_dir="",  # where built datasets live ("" = $IBPO_DATA_DIR or ~/.cache/ibpo_jax)
        train_split="train",
        eval_split="validation",
        test_split="test",
        eval_name="",  # evaluate on another task (e.g. "math500"); "" = the training task
        eval_path="",
        thinking=False,  # Qwen3 chat template's thinking switch (HF tokenizers only)
        arith=dict(num_steps=3, digits=1, ops="+-*"),
    )
    c.tokenizer = dict(path="")  # "" = the task's own (char tokenizer for arith) or model dir

    c.model = dict(
        preset="tiny",  # "tiny" (below), "hf" (checkpoint's config.json) or a
        # models.QWEN3_PRESETS name, e.g. "qwen3-32b" (checked against the checkpoint)
        checkpoint="",  # local HF directory of the base policy; "" = random / warm start
        dtype="float32",  # compute dtype
        param_dtype="float32",
        remat="none",  # layer rematerialization: "none", "dots" (keep matmul outputs), "full"
        scan_layers=False,
        logits_chunk=0,  # > 0: log-probs over chunks of this many positions, so the
        # [rows, T, vocab] float32 logits never exist whole (large vocabularies); 0 = in one go
        tiny=dict(
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
        ),
    )

    c.rollout = dict(
        prompts_per_step=16,
        group_size=8,  # G
        max_prompt_len=64,
        max_new_tokens=64,
        temperature=1.0,
        top_p=1.0,
        top_k=0,  # 0 = off
    )
    c.reward = dict(
        name="",  # "" = the task's reward
        num_workers=0,  # host processes scoring in parallel; 0 = in-process
        timeout_s=10.0,
        correct=1.0,  # DESIGN §1: R_i in {-1, +1}
        wrong=-1.0,
    )
    c.ibpo = dict(
        operator="lcs_first_error",  # registry.OPERATORS; "terminal" = plain base optimizer
        granularity="step",  # "step" (units = hashed lines) or "token"
        max_units=64,
        lam=0.5,  # λ of eq. 5
        credit="sequence",  # "sequence" (A_i) or "token" (A_it with Δ, DESIGN §3)
    )
    c.advantage = dict(
        normalize_std=True,  # False = Dr. GRPO
        eps=1e-6,
        ddof=0,
        gamma=1.0,  # PPO / GAE only
        gae_lambda=0.95,
    )
    c.loss = dict(
        name="gspo",  # registry.LOSSES
        aggregation="seq_mean_token_mean",  # registry.AGGREGATIONS
        clip_eps_low=3e-4,
        clip_eps_high=4e-4,
        beta=0.01,  # KL coefficient (paper §4.1)
        kl_estimator="k3",  # registry.KL_ESTIMATORS
        norm_const=0.0,  # seq_mean_token_sum_norm's constant; 0 = rollout.max_new_tokens
        value_coef=0.5,  # PPO only
        value_clip=0.2,  # PPO only
    )
    c.cancellation = dict(
        transform="none",  # registry.TRANSFORMS (DESIGN §5)
        # Log the shared-prefix log-prob drift across each step's updates (DESIGN §5): one
        # more forward pass per step, with the updated policy.
        log_drift=False,
    )
    c.optim = dict(
        lr=1e-6,
        schedule="constant",  # "constant" or "cosine" (after warm-up)
        warmup_steps=0,
        weight_decay=0.0,
        b1=0.9,
        b2=0.999,
        grad_clip=1.0,
        epochs=1,  # passes over each rollout batch (PPO epochs)
        minibatches=1,  # optimizer updates per epoch
        microbatches=1,  # gradient-accumulation chunks per minibatch
        # How the update's model passes see the rollout (same log-probs in each):
        # "grouped": each prompt encoded once for its G responses (fewest tokens when G > 1);
        # "packed": rollout rows packed several to a row (no padding work; "rows" instead
        # with a cancellation.transform, which needs a group's rows together);
        # "rows": the rollout's own rows.
        layout="grouped",
    )
    c.mesh = dict(data=-1, fsdp=1, tensor=1)  # -1 = all remaining devices
    c.train = dict(
        steps=400,
        eval_every=50,
        checkpoint_every=50,
        keep_checkpoints=3,
        distributed=False,  # call jax.distributed.initialize() (multi-host)
        progress=True,
    )
    c.eval = dict(
        num_prompts=256,
        samples=1,  # k of avg@k
        temperature=0.0,  # 0 = greedy
        top_p=1.0,
        max_new_tokens=0,  # 0 = rollout.max_new_tokens
    )
    c.warm_start = dict(
        enabled=False,  # supervised warm start on the task's reference solutions
        steps=400,
        batch_size=64,
        lr=3e-3,
        warmup_steps=50,
        cache_dir="",  # "" = <data_dir>/warm_start
    )
    return c


def _qwen3_math(c: ml_collections.ConfigDict, size: str) -> None:
    """The paper's setting (§4.1): lr 1e-6, β 0.01, G 8, λ 0.5, 400 steps, on Qwen3-<size>."""
    spec = _QWEN3_SIZES[size]
    c.task.name = "math_jsonl"  # --config.task.path=/data/deepscaler.jsonl
    c.task.eval_name = "math500"  # --config.task.eval_path=/data/math500/test.jsonl
    c.task.thinking = False
    c.model.preset = f"qwen3-{size}"
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.model.remat = "dots"
    c.model.scan_layers = True
    c.model.logits_chunk = 1024
    c.rollout.prompts_per_step = 128
    c.rollout.group_size = 8
    c.rollout.max_prompt_len = 1024
    c.rollout.max_new_tokens = 8192
    c.rollout.temperature = 1.0
    c.reward.num_workers = 16
    c.optim.lr = 1e-6
    c.optim.microbatches = spec["microbatches"]
    c.mesh.data = -1
    c.mesh.fsdp = spec["fsdp"]
    c.mesh.tensor = spec["tensor"]
    c.ibpo.max_units = 512
    c.train.steps = 400
    c.train.eval_every = 50
    c.train.checkpoint_every = 25
    c.train.distributed = True
    c.eval.num_prompts = 500
    c.eval.samples = 8  # avg@8
    c.eval.temperature = 0.6
    c.eval.top_p = 0.95


def _arith_tiny(c: ml_collections.ConfigDict) -> None:
    """Embedded task + tiny Qwen3 on 2 CPU cores: warm start, then RL, in about 10 minutes.

    The task (3 steps, 1-digit operands, + - *) is hard enough that the warm-started base
    solves about half the problems when sampling (room for RL) and easy enough to warm-start
    in a few minutes. 32 prompts x G 8 per step, four minibatch updates per rollout batch,
    lr 3e-5: higher rates (1e-4) fit each step's prompts and lose held-out accuracy, smaller
    batches gain less per step (README, "Tuning the default").
    """
    c.warm_start.enabled = True
    c.rollout.prompts_per_step = 32
    c.rollout.max_new_tokens = 48
    c.train.steps = 200
    c.train.eval_every = 50
    c.train.checkpoint_every = 50
    c.optim.lr = 3e-5
    c.optim.minibatches = 4
    c.loss.beta = 0.01
    # Held-out accuracy as avg@8 of sampled answers (temperature 1), the paper's avg@k.
    c.eval.num_prompts = 500
    c.eval.samples = 8
    c.eval.temperature = 1.0


def _smoke(c: ml_collections.ConfigDict) -> None:
    """Seconds-long run for tests: a smaller model and batch, a few steps.

    The 800-step warm start (about 30 s, cached in the data dir) makes the base solve about a
    third of the problems, so groups are mixed and φ and the advantages are not all zero: the
    tests then exercise the credit path, not a no-op.
    """
    _arith_tiny(c)
    c.model.tiny.update(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    c.rollout.prompts_per_step = 4
    c.rollout.group_size = 4
    c.rollout.max_new_tokens = 40
    c.optim.minibatches = 1
    c.warm_start.steps = 800
    c.warm_start.warmup_steps = 50
    c.warm_start.batch_size = 32
    c.train.steps = 4
    c.train.eval_every = 2
    c.train.checkpoint_every = 2
    # Evaluation samples like the rollout (same shapes and settings), so the run compiles one
    # sampler: tests stay fast.
    c.eval.num_prompts = 4
    c.eval.samples = 4
    c.eval.temperature = 1.0
    c.train.progress = False


def make(algo: str, preset: str | None = None) -> ml_collections.ConfigDict:
    """The config of `algo` (a key of ALGOS) under `preset` (one of PRESETS)."""
    if algo not in ALGOS:
        raise ValueError(f"unknown algorithm {algo!r}; valid: {', '.join(ALGOS)}")
    preset = preset or "arith_tiny"
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; valid: {', '.join(PRESETS)}")
    c = base()
    c.algo = algo
    c.preset = preset
    c.loss.name = ALGOS[algo]["loss"]
    c.ibpo.operator = ALGOS[algo]["operator"]
    if c.loss.name in ("grpo", "ppo"):  # token-level ratio clipping (DESIGN §4)
        c.loss.clip_eps_low = 0.2
        c.loss.clip_eps_high = 0.2
    if preset == "arith_tiny":
        _arith_tiny(c)
    elif preset == "smoke":
        _smoke(c)
    else:
        _qwen3_math(c, preset.removeprefix("qwen3_").removesuffix("_math"))
    return c
