"""The core's config sections: one frozen dataclass per section (`config.schema.Section`), each
with its defaults, a docstring per field and its own checks; the methods' sections live beside
their code (`ibpo_jax/methods/`). `ibpo_jax.config` assembles them into `RunConfig` (import the
sections from there). Importing this module does not import ml_collections."""

from __future__ import annotations

import dataclasses

from ibpo_jax.config import registry
from ibpo_jax.config.schema import MIN_TEMPERATURE, ConfigError, Section, hints  # noqa: F401
from ibpo_jax.config.tiny_model import TinyModelConfig
from ibpo_jax.models import config as model_config


@dataclasses.dataclass(frozen=True)
class TokenizerConfig(Section):
    KEY = "tokenizer"
    path: str = ""
    """"" = the task's own (char tokenizer for arith) or the model checkpoint's."""


@dataclasses.dataclass(frozen=True)
class LoraConfig(Section):
    KEY = "model.lora"
    rank: int = 0
    """LoRA rank r (models/lora.py): only adapters x·A·B·alpha/r on the `targets` projections
    are trained, the base is frozen and is π_ref; 0 = off (the whole policy is trained)."""
    alpha: float = 16.0
    """LoRA scale numerator: the adapters' output is multiplied by alpha / rank."""
    targets: str = "q,k,v,o,gate,up,down"
    """Comma list of the adapted projections: q, k, v, o, gate, up, down."""
    dropout: float = 0.0
    """Inverted dropout on the adapters' input, h = W0 x + (alpha / r) B A dropout(x) (Hu et al.
    2021; PEFT's `lora_dropout`), in [0, 1): only in the update's gradient passes, never in
    sampling, π_old / π_ref, evaluation, diagnostics or export. π_old is then a pass without
    it (the sampler's log-probs off-policy), so the first update's ratio is not exactly 1, as
    in PEFT-based trainers; it costs one extra forward pass per step with one update per
    rollout. A regularizer for small data / many epochs (PEFT's 0.05-0.1); 0 = off."""

    def check(self):
        from ibpo_jax.models import lora

        self._nonneg("rank")
        self._positive("alpha")
        try:
            lora.parse_targets(self.targets)
        except ValueError as e:
            self._require("targets", False, str(e))
        self._unit("dropout", open_high=True)
        self._require("dropout", self.dropout == 0 or self.rank > 0,
                      "dropout on the adapters needs LoRA (config.model.lora.rank > 0)")


@dataclasses.dataclass(frozen=True)
class ModelConfig(Section):
    KEY = "model"
    preset: str = "tiny"
    """"tiny" (model.tiny), "hf" (the checkpoint's config.json) or a models.QWEN3_PRESETS name,
    e.g. "qwen3-32b" (checked against the checkpoint)."""
    checkpoint: str = ""
    """Local HF directory of the base policy; "" = random init or warm start."""
    dtype: str = "float32"
    """Compute dtype: float32, bfloat16 or float16."""
    param_dtype: str = "float32"
    """Dtype the parameters are stored and updated in."""
    remat: str = "none"
    """Layer rematerialization: "none", "dots" (keep matmul outputs) or "full"."""
    scan_layers: bool = False
    """Run the decoder layers under `jax.lax.scan` (faster compiles)."""
    attention: str = "auto"
    """Attention kernel: "auto" (cudnn on GPU for 16-bit dtypes, splash on TPU, on CPU dense
    for short rows and chunked for long ones), "cudnn", "splash", "chunked" (blockwise XLA,
    memory linear in sequence length) or "dense" (the [T, S] scores in one go)."""
    logits_chunk: int = 0
    """> 0: log-probs over chunks of this many positions, so the [rows, T, vocab] float32
    logits never exist whole (large vocabularies); 0 = in one go."""
    tiny: TinyModelConfig = dataclasses.field(default_factory=TinyModelConfig)
    """The architecture of preset "tiny" (models.Qwen3Config fields)."""
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
    """LoRA adapters instead of full fine-tuning (rank 0 = off)."""

    def check(self):
        presets = ("tiny", "hf", *model_config.QWEN3_PRESETS)
        self._one_of("preset", presets)
        self._require("checkpoint", self.preset != "hf" or bool(self.checkpoint),
                      "config.model.preset='hf' reads the architecture from the checkpoint's "
                      "config.json: set config.model.checkpoint")
        for name in ("dtype", "param_dtype"):
            self._one_of(name, ("float32", "bfloat16", "float16"))
        self._one_of("remat", ("none", "dots", "full"))  # models.REMAT_POLICIES
        self._one_of("attention", model_config.ATTENTION_IMPLEMENTATIONS)
        self._nonneg("logits_chunk")


@dataclasses.dataclass(frozen=True)
class RolloutConfig(Section):
    KEY = "rollout"
    prompts_per_step: int = 16
    """Prompts per RL step (B); the step samples B x G responses."""
    group_size: int = 8
    """G, responses per prompt."""
    max_prompt_len: int = 64
    """Prompts are left-truncated to this many tokens."""
    max_new_tokens: int = 64
    """Response length limit (responses cut here count as truncated)."""
    temperature: float = 1.0
    """0 = greedy, else >= MIN_TEMPERATURE."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]; 1 = off."""
    top_k: int = 0
    """0 = off."""
    sample_chunk: int = 0
    """Prompts per sampler call, 0 = all prompts_per_step at once: the KV cache of every row
    at once (B·G rows of prompt + response tokens) is what long rollouts cannot hold, so they
    sample the step's prompts a chunk at a time (`python -m ibpo_jax.plan` sizes it)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: drop the groups whose raw outcome R (the verifier's, never a
    shaped reward) is all-equal and sample B more prompts, up to max_sampling_rounds rounds,
    until B mixed groups are found (trainer/dynamic.py); every sample counts in the budget."""
    max_sampling_rounds: int = 3
    """Sampling rounds per step with dynamic_sampling (>= 1, the first included); short of B
    mixed groups the step fills with filtered groups that carry no loss (`groups_mixed`)."""
    refill: bool = False
    """Slot refill (sampler/refill.py): the step's B x G rows form a queue and decode keeps
    sample_chunk x G slots busy, a finished row's slot taking the next waiting row, instead of
    decoding chunks until their longest row ends; the same samples as one call over all
    prompts. Needs 0 < sample_chunk < prompts_per_step. Off by default: it saves decode steps
    but on XLA:CPU runs slower (experiments/benchmarks/RESULTS.md), and no accelerator has
    measured it yet."""
    off_policy_steps: int = 0
    """1: the batch of step k+1 is sampled and scored with the parameters step k started from,
    in a background thread while step k's update runs (trainer/offpolicy.py); its sampler
    log-probs are π_old of the ratio. 0: on-policy, sampled after the previous update."""
    partial: bool = False
    """Partial rollouts (trainer/partial.py): partial_prompts prompts are in flight and decode in
    rounds of partial_tokens tokens a row; a step ends after the first round with B whole
    groups finished and learns the B oldest; unfinished rows carry over and continue under the
    next step's weights. Each token's sampler log-prob is π_old of its ratio; `policy_lag`
    counts tokens by the step that sampled them. Needs top_k 0, top_p 1, on-policy rollouts
    and no dynamic sampling."""
    partial_tokens: int = 0
    """Tokens an unfinished row decodes per round of partial rollouts; must divide
    max_new_tokens; 0 = max_new_tokens / 4."""
    partial_prompts: int = 0
    """Prompts in flight with partial rollouts (the step's B and those started early);
    >= prompts_per_step; 0 = 2 x prompts_per_step."""

    def check(self):
        self._positive("prompts_per_step", "group_size", "max_prompt_len", "max_new_tokens",
                       "max_sampling_rounds")
        self._nonneg("sample_chunk")
        self._require("sample_chunk", self.prompts_per_step % max(self.sample_chunk, 1) == 0,
                      f"must divide config.rollout.prompts_per_step={self.prompts_per_step}")
        self._require("refill", not self.refill
                      or 0 < self.sample_chunk < self.prompts_per_step,
                      "needs 0 < config.rollout.sample_chunk < config.rollout.prompts_per_step "
                      "(its slots are sample_chunk x group_size rows, refilled from the step's "
                      "queue)")
        self._temperature("temperature")
        self._require("top_p", 0 < self.top_p <= 1, "must be in (0, 1]")
        self._nonneg("top_k")
        self._require("off_policy_steps", self.off_policy_steps in (0, 1)
                      and (self.off_policy_steps == 0 or (self.top_k == 0 and self.top_p == 1)),
                      "must be 0 or 1; 1 needs top_k 0 and top_p 1 (the sampler's log-probs "
                      "are then the policy's, π_old of the ratio)")
        self._nonneg("partial_tokens", "partial_prompts")
        self._require("partial", not self.partial or (
            self.top_k == 0 and self.top_p == 1 and not self.off_policy_steps
            and not self.dynamic_sampling), "needs top_k 0, top_p 1 (the sampler's log-probs "
                      "are π_old), off_policy_steps 0 and dynamic_sampling False")
        self._require("partial_tokens", not self.partial
                      or self.max_new_tokens % self.round_tokens == 0,
                      f"must divide config.rollout.max_new_tokens={self.max_new_tokens} "
                      "(0: a quarter of it, which must then be whole)")
        self._require("partial_prompts", self.prompts_in_flight >= self.prompts_per_step,
                      f"must be >= config.rollout.prompts_per_step={self.prompts_per_step}")

    @property
    def round_tokens(self) -> int:
        """Tokens per round of partial rollouts (partial_tokens resolved)."""
        return self.partial_tokens or max(self.max_new_tokens // 4, 1)

    @property
    def prompts_in_flight(self) -> int:
        """Prompts in flight with partial rollouts (partial_prompts resolved)."""
        return self.partial_prompts or 2 * self.prompts_per_step


@dataclasses.dataclass(frozen=True)
class RewardConfig(Section):
    KEY = "reward"
    name: str = ""
    """A registry.REWARDS name; "" = the task's reward."""
    num_workers: int = 0
    """Host processes scoring in parallel; 0 = in-process."""
    timeout_s: float = 10.0
    """Per-response scoring time limit."""
    correct: float = 1.0
    """R_i of a correct response (DESIGN §1)."""
    wrong: float = -1.0
    """R_i of a wrong one; must be < correct."""
    sandbox: str = "strict"
    """Isolation of the scoring workers: "strict" or "best_effort"."""
    overlong: str = "none"
    """Truncated responses (no EOS within rollout.max_new_tokens): "none"; "filter", out of
    the loss (still in their group's advantage statistics); "soft", DAPO's linear length
    penalty over the last overlong_buffer tokens, added to R (trainer/dynamic.py)."""
    overlong_buffer: int = 0
    """L_cache of DAPO's soft overlong punishment (tokens before max_new_tokens where the
    penalty ramps from 0 to -overlong_penalty); > 0 with overlong "soft"."""
    overlong_penalty: float = 1.0
    """The soft penalty's largest magnitude, reached at rollout.max_new_tokens tokens."""

    def check(self):
        if self.name:
            self._registered("name", registry.REWARDS)
        self._nonneg("num_workers")
        self._positive("timeout_s")
        self._require("wrong", self.wrong < self.correct,
                      f"must be < config.reward.correct={self.correct!r}")
        self._one_of("sandbox", ("strict", "best_effort"))
        self._one_of("overlong", ("none", "filter", "soft"))
        self._nonneg("overlong_buffer", "overlong_penalty")
        self._require("overlong_buffer", self.overlong != "soft" or self.overlong_buffer > 0,
                      'must be > 0 with config.reward.overlong="soft"')


@dataclasses.dataclass(frozen=True)
class IbpoConfig(Section):
    KEY = "ibpo"
    operator: str = "lcs_first_error"
    """registry.OPERATORS name; "terminal" = the plain base optimizer (φ = 0); "checker" = the
    oracle (the task checker's first wrong step, arith and countdown); "peer_steps" = the
    first step no correct peer took, in the task's canonical form; "vouched_steps" = the step
    after the last prefix a correct peer's steps or a right completion vouch for."""
    granularity: str = "step"
    """Comparison units: "step" (hashed lines) or "token"."""
    max_units: int = 0
    """Comparison unit slots per response; 0 = every unit of the whole response (DESIGN §2).
    A positive value is a memory cap: units past it are left out of φ and Δ, and the share of
    rows it cuts is logged as units_truncated_frac."""
    lam: float = 0.5
    """λ of eq. 5: r̃ = R + λφ."""
    credit: str = "sequence"
    """"sequence" (A_i) or "token" (A_it with Δ, DESIGN §3)."""
    alignment: str = "lcs"
    """How a wrong response is aligned to the correct ones: "lcs" or "prefix"."""
    reduce: str = "max"
    """How the scores against the group's correct responses combine: "max" or "mean"."""
    completions: int = 8
    """"vouched_steps": continuations the policy samples from each step prefix it tests; each
    is a trajectory of the budget (trainer/vouch.py). Its sampler calls take the rollout's
    chunk of prefixes (rollout.sample_chunk, else prompts_per_step)."""
    correction_rollouts: bool = False
    """Appendix B's correction stage (DESIGN §6): each wrong response with a correct peer gets
    one corrected output, trained on as extra samples; each costs 1.2 trajectories."""

    def check(self):
        self._registered("operator", registry.OPERATORS)
        self._one_of("granularity", ("step", "token"))
        self._nonneg("max_units")
        self._nonneg("lam")
        self._one_of("credit", ("sequence", "token"))
        self._one_of("alignment", ("lcs", "prefix"))
        self._one_of("reduce", ("max", "mean"))
        self._positive("completions")
        self._require("granularity", self.operator != "vouched_steps"
                      or self.granularity == "step",
                      'must be "step" with config.ibpo.operator="vouched_steps"')


@dataclasses.dataclass(frozen=True)
class AdvantageConfig(Section):
    KEY = "advantage"
    estimator: str = "auto"
    """registry.ESTIMATORS name; auto: gae with loss.name=ppo, grpo_token with
    ibpo.credit=token, else grpo (a "token" estimator goes with ibpo.credit=token, a "value"
    one with ppo's value head: core.advantages.TAKES)."""
    normalize_std: bool = True
    """Divide by the group std (False = Dr. GRPO); PPO: whiten over the batch."""
    eps: float = 1e-6
    """Added to the std before dividing (degenerate groups never NaN)."""
    ddof: int = 0
    """Delta degrees of freedom of the group std (0 = population)."""
    gamma: float = 1.0
    """PPO / GAE discount."""
    gae_lambda: float = 0.95
    """PPO / GAE λ, in [0, 1]."""

    def check(self):
        if self.estimator != "auto":
            self._registered("estimator", registry.ESTIMATORS)
        self._nonneg("eps", "ddof")
        self._unit("gamma")
        self._unit("gae_lambda")


# Each loss's clip range (ε_low, ε_high), what "auto" resolves to (DESIGN §4).
CLIP_EPS = {"gspo": (3e-4, 4e-4), "gspo_token": (3e-4, 4e-4), "grpo": (0.2, 0.2), "ppo": (0.2, 0.2)}


@dataclasses.dataclass(frozen=True)
class LossConfig(Section):
    """The policy loss and its hyperparameters: also the `losses.LossSpec` every loss takes."""

    KEY = "loss"
    name: str = "gspo"
    """registry.LOSSES name."""
    aggregation: str = "seq_mean_token_mean"
    """registry.AGGREGATIONS name (DESIGN §4)."""
    clip_eps_low: float | str = "auto"
    """Clip range [1 - clip_eps_low, 1 + clip_eps_high]; "auto" = the loss's own (CLIP_EPS:
    GSPO 3e-4 / 4e-4, GRPO / PPO 0.2)."""
    clip_eps_high: float | str = "auto"
    """Upper clip ε (clip-higher when > clip_eps_low); "auto" = the loss's own (CLIP_EPS)."""
    beta: float = 0.01
    """KL coefficient (paper §4.1)."""
    kl_estimator: str = "k3"
    """registry.KL_ESTIMATORS name."""
    norm_const: float = 0.0
    """seq_mean_token_sum_norm's constant; 0 = rollout.max_new_tokens."""
    value_coef: float = 0.5
    """PPO only: weight of the value loss."""
    value_clip: float = 0.2
    """PPO only: ε_v of the clipped value loss (reward units)."""
    kl_in: str = "loss"
    """Where β·KL goes (DESIGN §4): "loss" (a term of the loss) or "reward" (β · the row's
    summed per-token estimate under the sampler, no gradient, taken off R before the
    advantages; PPO: off its terminal reward)."""
    tis: str = "none"
    """Sampler-trainer mismatch correction (DESIGN §4): "none", "token" or "sequence"
    (truncated importance sampling on π_old / π_sampler per token, or per row's geometric mean)."""
    tis_cap: float = 2.0
    """TIS cap C > 1 on the ratio π_old / π_sampler."""
    tis_mode: str = "truncate"
    """"truncate" (weight min(ratio, C)) or "mask" (tokens / rows whose ratio exceeds C get 0)."""
    entropy_coef: float = 0.0
    """> 0: adds -entropy_coef · (the loss aggregation of the per-token policy entropy)."""

    def __post_init__(self):
        for i, name in enumerate(("clip_eps_low", "clip_eps_high")):  # "auto": from the loss
            if getattr(self, name) == "auto" and self.name in CLIP_EPS:
                object.__setattr__(self, name, CLIP_EPS[self.name][i])
        super().__post_init__()

    def check(self):
        self._registered("name", registry.LOSSES)
        self._registered("aggregation", registry.AGGREGATIONS)
        self._registered("kl_estimator", registry.KL_ESTIMATORS)
        losses = ", ".join(CLIP_EPS)  # "auto" left over: a loss without a range of its own
        for name in ("clip_eps_low", "clip_eps_high"):
            self._require(name, not isinstance(getattr(self, name), str),
                          f'expected a float, or "auto" for a loss of CLIP_EPS ({losses})')
        self._unit("clip_eps_low")
        self._nonneg("clip_eps_high", "beta", "norm_const", "value_coef", "value_clip",
                     "entropy_coef")
        self._one_of("kl_in", ("loss", "reward"))
        self._one_of("tis", ("none", "token", "sequence"))
        self._one_of("tis_mode", ("truncate", "mask"))
        self._require("tis_cap", self.tis_cap > 1, "expected a cap > 1")


@dataclasses.dataclass(frozen=True)
class CancellationConfig(Section):
    KEY = "cancellation"
    transform: str = "none"
    """registry.TRANSFORMS name (DESIGN §5)."""
    log_drift: bool = False
    """Log the shared-prefix log-prob drift across each step's updates (DESIGN §5): one more
    forward pass per step, with the updated policy."""

    def check(self):
        self._registered("transform", registry.TRANSFORMS)


@dataclasses.dataclass(frozen=True)
class OptimConfig(Section):
    KEY = "optim"
    lr: float = 1e-6
    """Peak learning rate of AdamW."""
    schedule: str = "constant"
    """"constant" or "cosine" (after warm-up)."""
    warmup_steps: int = 0
    """Linear warm-up, in optimizer updates."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay."""
    b1: float = 0.9
    """Adam's first-moment decay, in [0, 1)."""
    b2: float = 0.999
    """Adam's second-moment decay, in [0, 1)."""
    grad_clip: float = 1.0
    """Global-norm clip; 0 = off."""
    epochs: int = 1
    """Passes over each rollout batch (PPO epochs)."""
    minibatches: int = 1
    """Optimizer updates per epoch."""
    microbatches: int | str = 1
    """Gradient-accumulation chunks per minibatch, or "auto": the smallest count whose update
    fits the devices' memory, resolved at start-up by `ibpo_jax.plan` (1 at once when a
    DESIGN §9 estimate of one chunk is far below the memory). Or set micro_batch_rows."""
    micro_batch_rows: int = 0
    """> 0: rows (responses) per batch device in one gradient micro-batch, as verl's
    ppo_micro_batch_size_per_gpu and TRL's per_device_train_batch_size count it; the count is
    then the fewest whole-group micro-batches that hold no more than this on each of the mesh's
    data x fsdp devices (`plan.rows_microbatches`), so a preset stays valid when the batch
    shrinks. 0: optim.microbatches decides."""
    layout: str = "grouped"
    """How the update's model passes see the rollout (same log-probs in each): "grouped",
    each prompt encoded once for its G responses; "packed", rollout rows packed several to a
    row ("rows" instead with a cancellation.transform: see RunConfig.update_layout); "rows",
    the rollout's own rows."""

    def check(self):
        self._nonneg("lr", "warmup_steps", "weight_decay", "grad_clip")
        self._one_of("schedule", ("constant", "cosine"))
        self._unit("b1", open_high=True)
        self._unit("b2", open_high=True)
        self._positive("epochs", "minibatches")
        mb = self.microbatches
        self._require("microbatches", mb == "auto" or (isinstance(mb, int) and mb > 0),
                      'must be > 0 or "auto"')
        self._nonneg("micro_batch_rows")
        self._require("micro_batch_rows", not self.micro_batch_rows or mb == 1,
                      f"config.optim.microbatches={mb!r} sets the micro-batches too: set one "
                      "(config.optim.micro_batch_rows=0 for microbatches)")
        self._one_of("layout", ("grouped", "packed", "rows"))


@dataclasses.dataclass(frozen=True)
class TrainLoopConfig(Section):
    KEY = "train"
    steps: int = 400
    """RL steps of the run."""
    eval_every: int = 50
    """Evaluate every this many steps (and at the end)."""
    checkpoint_every: int = 50
    """Checkpoint every this many steps (and at the end)."""
    keep_checkpoints: int = 3
    """Checkpoints kept in the workdir (the latest ones)."""
    distributed: str = "auto"
    """Start jax.distributed (multi-host): "auto" when the environment launched several
    processes (JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES, an srun of several tasks, Open
    MPI, a multi-host TPU slice: sharding.multiprocess_launch), "true" or "false"."""
    heartbeat_s: int = 60
    """Multi-process runs: seconds without a process's heartbeat before the others give it up
    (jax.distributed's heartbeat timeout); each then exits 4 with one line naming it, the last
    checkpoint and the command that resumes (trainer/supervisor.py)."""
    progress: bool = True
    """Show a progress bar."""
    allow_config_change: bool = False
    """Resume a workdir whose checkpoint was written under another config only when true."""
    budget: int = 0
    """Stop once budget_trajectories reaches this many sampled trajectories (DESIGN §6, so
    methods compare at equal budget), evaluating and checkpointing there; 0 = train.steps."""

    def __post_init__(self):
        if isinstance(self.distributed, bool):  # configs and checkpoints from before "auto"
            object.__setattr__(self, "distributed", str(self.distributed).lower())
        super().__post_init__()

    def check(self):
        self._positive("steps", "eval_every", "checkpoint_every", "keep_checkpoints",
                       "heartbeat_s")
        self._nonneg("budget")
        self._one_of("distributed", ("auto", "true", "false"))


@dataclasses.dataclass(frozen=True)
class DiagnosticsConfig(Section):
    KEY = "diagnostics"
    grad_var_every: int = 0
    """Log the gradient variance every this many steps; 0 = off."""

    def check(self):
        self._nonneg("grad_var_every")
