"""The programs of one RL step, lowered and compiled from abstract inputs (nothing allocated).

Every input is a `jax.ShapeDtypeStruct` with the sharding the trainer gives it: parameters and
Adam moments in the TRAINING layout (fully sharded over fsdp × tensor), the frozen reference
as `policy.load_base` loads it, rollout arrays split over the batch axes. The functions lowered
are the trainer's own: the sampler's `prefill`, its decode-loop `segment` and `grow`
(`sampling.generate_fn`), `step.credit` (φ) and `step.update` (`step.step_functions`), and
`step.prepare_batch` (the reference / old-policy scoring the update starts with) on its own.

Shapes: B prompts per step, G samples per prompt, N = B·G rows, P prompt and R response
columns, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ibpo_jax import models
from ibpo_jax.config import RunConfig
from ibpo_jax.config.registry import PROCEDURAL
from ibpo_jax.core import comparison
from ibpo_jax.models import kv_cache, lora
from ibpo_jax.plan import flops as flops_lib
from ibpo_jax.runtime import sharding
from ibpo_jax.sampler import refill, sampling
from ibpo_jax.trainer import packing, policy, step
from ibpo_jax.trainer.state import TrainState, make_optimizer

SDS = jax.ShapeDtypeStruct


@dataclasses.dataclass
class Program:
    """One compiled program: its per-device memory (bytes) and its cost per run."""

    name: str
    argument: int
    output: int
    alias: int
    temp: int
    runs: float  # times per RL step
    count: flops_lib.Count  # FLOPs / matmul bytes of one run (global, loop-aware)
    xla_flops: float  # compiled.cost_analysis()'s figure (loop bodies counted once)
    resident_args: int  # bytes of resident state (params, moments, reference) among its args
    note: str = ""
    xla_bytes: float = 0.0  # cost_analysis()'s "bytes accessed" (loop bodies once)
    hbm_bytes: float | None = None  # per device per run, when known better than count.bytes

    @property
    def peak(self) -> int:
        return self.argument + self.output - self.alias + self.temp


def model_of(cfg: RunConfig, target: str = "cpu"
             ) -> tuple[models.Qwen3Config, models.ModelOptions, str]:
    """(architecture, options, attention note) the trainer would run. Planning for a GPU/TPU
    `target` platform on CPU devices, its attention kernel (cudnn, splash) compiles as the XLA
    stand-in `chunked` (same O(T · block) memory): the note says so."""
    if cfg.model.checkpoint:
        config = models.Qwen3Config.from_hf(cfg.model.checkpoint)
    elif cfg.model.preset == "tiny":
        if cfg.task.name not in PROCEDURAL or cfg.tokenizer.path:
            raise ValueError("the plan of a 'tiny' model needs a procedural task's char "
                             f"tokenizer ({', '.join(PROCEDURAL.names())}; or give "
                             "config.model.checkpoint)")
        from ibpo_jax.data.tokenizer import CharTokenizer

        config = policy.architecture(cfg, CharTokenizer().vocab_size)
    else:
        config = policy.architecture(cfg, 0)
    opts = policy.model_options(cfg)
    note = "dense (the model's only kernel)"
    fields = {f.name for f in dataclasses.fields(models.ModelOptions)}
    if "attention" in fields:
        wanted = getattr(cfg.model, "attention", "auto")
        opts.setdefault("attention", wanted)
        note = wanted
        if target != "cpu" and jax.default_backend() == "cpu" and wanted in (
                "auto", "cudnn", "splash"):
            opts["attention"] = "chunked"
            note = f"chunked (XLA stand-in for {wanted} on simulated CPU devices)"
    return config, models.make_options(jnp.dtype(cfg.model.dtype), **opts), note


def _placed(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda a, s: SDS(a.shape, a.dtype, sharding=s), tree, shardings)


def concrete(tree: Any, mesh: Mesh) -> Any:
    """Abstract values with their (abstract-mesh) shardings made concrete on `mesh`;
    leaves without one replicated."""
    def one(a):
        spec = getattr(getattr(a, "sharding", None), "spec", None)
        return SDS(a.shape, a.dtype, sharding=NamedSharding(mesh, spec if spec is not None
                                                            else P()))
    return jax.tree.map(one, tree)


def outputs(traced: Any, compiled: Any, mesh: Mesh) -> Any:
    """A program's outputs as abstract values with the shardings its compile chose (what the
    next program receives); from the trace alone when it was not compiled."""
    if compiled is None:
        return concrete(traced.out_info, mesh)
    return jax.tree.map(lambda a, sh: SDS(a.shape, a.dtype, sharding=sh), traced.out_info,
                        compiled.output_shardings)


def _like_params(tree: Any, params: Any, mesh: Mesh) -> Any:
    """Optimizer state as abstract values: each leaf that mirrors a parameter (Adam's moments:
    same dict path, same shape) sharded like it, the rest (counters) replicated; what
    `optimizer.init` of the placed params gives eagerly (zeros_like keeps the sharding)."""
    keys = lambda path: tuple(str(k.key) for k in path if hasattr(k, "key"))  # noqa: E731
    by_path = {keys(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}

    def one(path, leaf):
        p = by_path.get(keys(path))
        sh = p.sharding if p is not None and p.shape == leaf.shape else NamedSharding(mesh, P())
        return SDS(leaf.shape, leaf.dtype, sharding=sh)

    return jax.tree_util.tree_map_with_path(one, tree)


def device_bytes(tree: Any) -> int:
    """Bytes one device holds of abstract arrays (their shard shapes)."""
    total = 0
    for a in jax.tree.leaves(tree):
        shape = a.sharding.shard_shape(a.shape) if getattr(a, "sharding", None) else a.shape
        total += math.prod(shape) * _itemsize(a.dtype)
    return total


def _itemsize(dtype: Any) -> int:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return 8  # threefry: two uint32
    return np.dtype(dtype).itemsize


LOG = None  # a print-like function for compile progress (set by plan_json)
ONLY: tuple[str, ...] | None = None  # compile only these programs (tests); None = all
# The programs whose outputs a program takes: their compile picks those inputs' shardings (a
# trace has none, and `concrete` would replicate every array: decode's KV cache whole on each
# device, 2x the 8B decode's device peak), so compiling a program compiles these too. ALWAYS:
# the sampler's weight copy sets every plan's decode bytes per step (`decode_step_bytes`), and
# φ's FLOPs are XLA's count (it has no matmuls): both are cheap to compile.
FEEDS = {"prefill": ("sampling weights",), "decode": ("sampling weights", "prefill"),
         "update": ("credit (φ)",)}
ALWAYS = ("sampling weights", "credit (φ)")


def compiled_names(only: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """The programs a plan of `only` compiles: those named, those whose outputs they take
    (FEEDS) and ALWAYS; None (all) for None."""
    if only is None:
        return None
    return tuple(dict.fromkeys(n for o in (*ALWAYS, *only) for n in (*FEEDS.get(o, ()), o)))


def _compile(name: str, traced: Any, runs: float, resident_args: int, note: str = "", *,
             force: bool = False) -> tuple[Program, Any]:
    if not force and ONLY is not None and name not in ONLY:  # FLOPs counted, no memory
        return Program(name, 0, 0, 0, 0, runs, flops_lib.count_traced(traced), 0.0,
                       resident_args, "not compiled"), None
    t0 = time.perf_counter()
    compiled = traced.lower().compile()
    if LOG is not None:
        LOG(f"  compiled {name} in {time.perf_counter() - t0:.0f} s")
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list) else cost
    prog = Program(name, int(mem.argument_size_in_bytes), int(mem.output_size_in_bytes),
                   int(mem.alias_size_in_bytes), int(mem.temp_size_in_bytes), runs,
                   flops_lib.count_traced(traced), float(cost.get("flops", 0.0)),
                   resident_args, note, float(cost.get("bytes accessed", 0.0)))
    return prog, compiled


@dataclasses.dataclass
class Setup:
    """Everything abstract one RL step needs, on `mesh`."""

    cfg: RunConfig
    mesh: Mesh
    config: models.Qwen3Config
    options: models.ModelOptions
    attention: str
    params: Any  # policy, TRAINING layout, param dtype (LoRA: the base with its adapters)
    reference: Any  # the frozen base, as the trainer holds it (LoRA: the base itself)
    state: TrainState
    optimizer: Any
    microbatches: int
    sampling_copy: int = 0  # per-device bytes of the sampler's weights (set by compile_all)

    @property
    def resident(self) -> dict[str, int]:
        """Per-device bytes of what stays on the devices through the step."""
        return {"params": device_bytes(self.state.params),  # LoRA: the adapters
                "adam": device_bytes(self.state.opt_state),
                "reference": device_bytes(self.reference)}


def _reference(params: Any, options: models.ModelOptions, mesh: Mesh) -> Any:
    """The frozen reference as the trainer holds it: `state.frozen_reference` (matrices in the
    compute dtype, placed like the policy) where the trainer has it, else the base policy
    itself in the param dtype."""
    from ibpo_jax.trainer import state as state_lib

    make = getattr(state_lib, "frozen_reference", None)
    if make is None:
        return params
    return _like_params(jax.eval_shape(lambda p: make(p, options.dtype), params), params, mesh)


def setup(cfg: RunConfig, mesh: Mesh, microbatches: int, target: str = "cpu") -> Setup:
    config, options, note = model_of(cfg, target)
    params = models.abstract_params(config, options)
    params = _placed(params, sharding.param_shardings(params, mesh))
    if cfg.model.lora.rank:  # LoRA: the state trains adapters; π_ref is the base, no copy
        trained = jax.eval_shape(lambda: lora.init(
            params, rank=cfg.model.lora.rank, targets=lora.parse_targets(cfg.model.lora.targets),
            key=jax.random.key(0)))
        trained = _placed(trained, sharding.param_shardings(trained, mesh))
        reference, params = params, lora.merge(params, trained)
    else:
        trained, reference = params, _reference(params, options, mesh)
    optim = dataclasses.replace(cfg.optim, microbatches=microbatches, micro_batch_rows=0)
    optimizer = make_optimizer(optim, total_updates=cfg.train.steps * optim.epochs
                               * optim.minibatches)
    opt_state = _like_params(jax.eval_shape(optimizer.init, trained), trained, mesh)
    state = TrainState(trained, opt_state, SDS((), jnp.int32, sharding=NamedSharding(mesh, P())))
    return Setup(cfg, mesh, config, options, note, params, reference, state, optimizer,
                 microbatches)


def _rollout(s: Setup) -> tuple[step.Rollout, Any, packing.Packing, Any]:
    """(rollout, key, plan, is_delim): the update's inputs that the sampler and the host make."""
    r, mesh = s.cfg.rollout, s.mesh
    n, p, w = r.prompts_per_step * r.group_size, r.max_prompt_len, r.max_new_tokens
    batch = lambda shape, dtype: SDS(shape, dtype,  # noqa: E731
                                     sharding=sharding.batch_sharding(mesh, len(shape)))
    rep = lambda shape, dtype: SDS(shape, dtype, sharding=NamedSharding(mesh, P()))  # noqa: E731
    rollout = step.Rollout(
        prompt=batch((n, p), jnp.int32), prompt_len=batch((n,), jnp.int32),
        response=batch((n, w), jnp.int32), response_len=batch((n,), jnp.int32),
        sample_logp=batch((n, w), jnp.float32), reward=batch((n,), jnp.float32),
        correct=batch((n,), jnp.bool_), ended=batch((n,), jnp.bool_),
        # the host's first-error labels, where the operator reads them
        step_truth=batch((n,), jnp.int32) if s.cfg.ibpo.operator in comparison.NEEDS_TRUTH
        else None,
        step_vouched=batch((n,), jnp.int32)
        if s.cfg.ibpo.operator in comparison.NEEDS_VOUCHED else None)
    # "packed": at most N model rows (a row each), partitioned a row at a time.
    unit = 1 if s.cfg.update_layout == "packed" else r.group_size
    plan = packing.Packing(rep((n,), jnp.int32), rep((n,), jnp.int32), n, unit)
    key = rep((), jax.eval_shape(lambda: jax.random.key(0)).dtype)
    return rollout, key, plan, rep((s.config.vocab_size,), jnp.bool_)


def spec_of(s: Setup) -> step.StepSpec:
    return step.StepSpec.from_config(s.cfg, s.config, s.options).with_optim(
        microbatches=s.microbatches)


def compile_credit(s: Setup, *, force: bool = False) -> tuple[Program, Any]:
    """φ (`step.credit`): its program and its first output (the update's input) with the
    shardings its compile chose."""
    rollout, _, _, is_delim = _rollout(s)
    with jax.set_mesh(s.mesh):
        traced = jax.jit(functools.partial(step.credit, spec_of(s))).trace(rollout, is_delim)
        prog, compiled = _compile("credit (φ)", traced, 1, 0, force=force)
        return prog, outputs(traced, compiled, s.mesh)[0]


def compile_update(s: Setup, credit_out: Any | None = None, *, force: bool = False
                   ) -> tuple[Program, Any]:
    """The update (π_ref / π_old scoring, then epochs × minibatches × micro-batches); `force`:
    compiled whatever ONLY says (the micro-batch search). Without `credit_out`, φ is compiled
    for its output's shardings."""
    rollout, key, plan, _ = _rollout(s)
    spec = spec_of(s)
    state_shardings = jax.tree.map(lambda a: a.sharding, s.state)
    _, update_fn = step.step_functions(spec, s.optimizer, state_shardings)
    if credit_out is None:
        credit_out = compile_credit(s, force=True)[1]
    with jax.set_mesh(s.mesh):
        traced = update_fn.trace(s.state, s.reference, rollout, credit_out, key, plan)
        mb, r = s.microbatches, s.cfg.rollout
        rows = r.prompts_per_step * r.group_size // mb // s.cfg.optim.minibatches
        return _compile("update", traced, 1, device_bytes((s.state, s.reference)),
                        f"{mb} micro-batch{'es' if mb > 1 else ''} of {rows} rows", force=force)


class Calls(NamedTuple):
    """One step's sampler calls as the plan compiles them, every row to its limit."""

    prompts: int  # prompts per call (refill: the call's store; partial: rows, each a prompt)
    samples: int  # rows per prompt
    width: int  # prompt width
    new_tokens: int  # tokens a call decodes per row
    calls: int  # calls per step
    rows: int  # rows decoding at once (refill: its slots)


def sampler_calls(cfg: RunConfig) -> Calls:
    """The step's sampler calls (`Calls`). Partial rollouts (trainer/partial.py): rounds of
    T tokens over C = sample_chunk x G rows, each row a prompt of its own as wide as prompt +
    the longest prefix (P + N - T); a step decodes B x G rows' N tokens in steady state, so
    (B x G / C) x (N / T) calls (with refill: N / T calls of B x G / C passes, each call's
    store every row of the K x G in flight). A fresh prompt's first round is today's call with
    T tokens: narrower than these, and not compiled apart."""
    r = cfg.rollout
    g, b, p, n = r.group_size, r.prompts_per_step, r.max_prompt_len, r.max_new_tokens
    chunk = r.sample_chunk or b
    if r.partial:
        c, rounds, width = chunk * g, n // r.round_tokens, p + n - r.round_tokens
        if r.refill:
            return Calls(r.prompts_in_flight * g, 1, width, r.round_tokens, rounds, c)
        return Calls(c, 1, width, r.round_tokens, b * g // c * rounds, c)
    if r.refill:
        return Calls(b, g, p, n, 1, chunk * g)
    return Calls(chunk, g, p, n, b // chunk, chunk * g)


def generator(s: Setup) -> Any:
    """The sampler function of the step's calls (`sampler_calls`): slot refill's or the
    one-pass sampler, as the trainer makes it (`batching.sampler`)."""
    r, c = s.cfg.rollout, sampler_calls(s.cfg)
    kw = dict(max_new_tokens=c.new_tokens, temperature=r.temperature, top_p=r.top_p,
              top_k=r.top_k, num_samples=c.samples, eos_ids=(0,), pad_id=0, mesh=s.mesh)
    return (refill.refill_fn(s.config, s.options, slots=c.rows, **kw)
            if r.refill else sampling.generate_fn(s.config, s.options, **kw))


def sample(s: Setup, gen: Any, weights: Any, key: Any) -> list[Program]:
    """The prefill and decode legs of the step's sampler calls, from the weight copy."""
    mesh, r, c = s.mesh, s.cfg.rollout, sampler_calls(s.cfg)
    b, calls = c.prompts, c.calls
    split = b % (mesh.shape["data"] * mesh.shape["fsdp"]) == 0
    psh = sharding.batch_sharding if split else (lambda m, nd: NamedSharding(m, P()))
    prompts = SDS((b, c.width), jnp.int32, sharding=psh(mesh, 2))
    lens = SDS((b,), jnp.int32, sharding=psh(mesh, 1))
    if r.refill:  # the call's prompt store, then S slots refilled from the queue
        traced = gen.programs.start.trace(weights, prompts, lens, key, b * c.samples)
        note = f"{b} prompts encoded once (slot refill's store)"
    else:
        traced = gen.prefill.trace(weights, prompts, lens, key)
        note = f"{b} prompts x {c.samples}"
    if r.partial:
        note += f", {c.width} wide (partial rollouts' rounds: prompt + prefix)"
    prog, compiled = _compile("prefill", traced, calls, 0, note)
    return [prog, *_decode(s, gen, weights, outputs(traced, compiled, mesh), calls)]


# More sampler calls of a step: (setup, the weight copy, key) -> their programs (the plan
# passes `plan.vouch.programs`, vouched_steps' continuation call).
Extra = Callable[["Setup", Any, Any], list[Program]]


def compile_all(s: Setup, *, update: tuple[Program, Any] | None = None,
                extra: Sequence[Extra] = ()) -> list[Program]:
    """Every program of one RL step (the update's compile can be passed in: the search for
    micro-batches already made it), with the `extra` sampler calls after the rollout's."""
    rollout, key, plan, _ = _rollout(s)
    spec = spec_of(s)
    gen = generator(s)
    with jax.set_mesh(s.mesh):
        # The sampler's weights: the compute-dtype copy in its layout, made once per rollout
        # (its chunks' and rounds' calls share it) and an argument of prefill and every
        # decode leg.
        traced = gen.weights.trace(s.params)
        prog, compiled = _compile("sampling weights", traced, 1, device_bytes(s.params),
                                  "the compute-dtype copy decode reads, one per rollout")
        weights = outputs(traced, compiled, s.mesh)
        s.sampling_copy = device_bytes(weights)
        programs = [prog, *sample(s, gen, weights, key)]
        for more in extra:
            programs += more(s, weights, key)
        prog, credit_out = compile_credit(s)
        programs.append(prog)
        # π_ref / π_old scoring runs inside the update (its memory is the update's): traced
        # for its FLOPs only.
        score = jax.jit(functools.partial(step.prepare_batch, spec))
        traced = score.trace(s.state, s.reference, rollout, credit_out, plan)
        what = "π_ref" + ("" if spec.single_update else " + π_old")
        programs.append(Program("score", 0, 0, 0, 0, 0, flops_lib.count_traced(traced), 0.0,
                                device_bytes((s.state, s.reference)),
                                f"{what} log-probs; inside the update (FLOPs only)"))
    programs.append((update or compile_update(s, credit_out))[0])
    return programs


def _segment(gen: Any) -> Any:
    """The decode leg of a `sampling.generate_fn` function, jitted as the sampler jits it
    (`sampling._compiled`): its decode loop runs it from the host, so it is no attribute
    (slot refill's: its `programs`)."""
    if hasattr(gen, "programs"):
        return gen.programs.segment
    segment = getattr(gen, "segment", None)
    if segment is None:
        sampler = gen.prefill.__wrapped__.__self__  # the _Sampler whose method was jitted
        segment = jax.jit(sampler.segment, donate_argnums=1, static_argnums=3)
    return segment


def _grown(state: Any, width: int, mesh: Mesh) -> tuple[Any, int]:
    """The decode state with its row cache grown to `width` slots, and the per-device bytes
    the eager growth (`kv_cache.grow_consumed`: one padded array at a time, the old one freed
    after) holds at its peak: the old state plus the largest new array."""
    # Padding keeps each array's sharding: only the slot dimension grows.
    rows = jax.tree.map(lambda a, old: SDS(a.shape, a.dtype, sharding=old.sharding),
                        jax.eval_shape(lambda r: kv_cache.grow(r, width), state.cache.rows),
                        state.cache.rows)
    new = state._replace(cache=state.cache._replace(rows=rows))
    largest = max(device_bytes(a) for a in jax.tree.leaves(rows))
    return new, device_bytes(state) + largest


def _decode(s: Setup, gen: Any, weights: Any, state: Any, calls: int) -> list[Program]:
    """The decode loop's legs (`kv_cache.decode_stops`), every row active to the last step
    (the worst case: compaction drops finished rows, which only lowers these figures): FLOPs
    per step traced at every width, memory compiled at the widest, with the growth into it.
    Slot refill: its S slots decode the step's rows in B*G / S passes of the same legs."""
    r, mesh, c = s.cfg.rollout, s.mesh, sampler_calls(s.cfg)
    n = c.new_tokens
    widths = kv_cache.slot_widths(max(n - 1, 1))
    segment = _segment(gen)
    total = rows = c.prompts * c.samples
    if r.refill:  # `total` is the queue's, the rows decoding at once the slots; every call
        rows = gen.slots  # decodes B x G rows (partial rollouts: in steady state)
        calls *= -(-r.prompts_per_step * r.group_size // rows)
    stop = SDS((), jnp.int32, sharding=NamedSharding(mesh, P()))
    count, hbm, steps, before, out = flops_lib.Count(), 0.0, 0, 0, []
    for i, width in enumerate(widths):
        if i:
            state, held = _grown(state, width, mesh)
            if i == len(widths) - 1 and (ONLY is None or "decode" in ONLY):
                out.append(Program("decode: grow cache", held + s.sampling_copy, 0, 0, 0,
                                   calls * (len(widths) - 1),
                                   flops_lib.Count(), 0.0, 0,
                                   f"eager, to {width} slots (from shapes, not compiled)"))
        seg = segment.trace(weights, state, stop, total)
        n_steps = min(width, n - 1) - before
        count.add(flops_lib.count_traced(seg), n_steps)
        hbm += n_steps * decode_step_bytes(s, width)
        steps, before = steps + n_steps, before + n_steps
    prog = _compile("decode", seg, steps * calls, 0,
                    f"{calls} x {steps} steps (no row ends early), {rows} rows, memory at "
                    f"{widths[-1]} slots" + (", slot refill" if r.refill else ""))[0]
    prog.count = flops_lib.Count(count.flops / max(steps, 1), count.bytes / max(steps, 1))
    prog.hbm_bytes = hbm / max(steps, 1)
    return out + [prog]


def _kv_bytes(s: Setup, tokens: float) -> float:
    """Per-device bytes of `tokens` tokens' keys and values in the compute dtype."""
    c, mesh = s.config, s.mesh
    per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim \
        * np.dtype(s.options.dtype).itemsize
    kv_shards = mesh.shape["data"] * mesh.shape["fsdp"] * min(mesh.shape["tensor"],
                                                              c.num_key_value_heads)
    return per_token * tokens / kv_shards


def kv_cache_bytes(s: Setup, slots: int | None = None) -> float:
    """Per-device bytes of one sampler call's KV cache with `slots` row slots (None: as many
    as it decodes tokens): prompt part (one per prompt) + row part (one per sample), in the
    compute dtype. Slot refill: its store (every prompt of the call) + its slots' rows."""
    c = sampler_calls(s.cfg)
    slots = c.new_tokens if slots is None else slots
    rows = c.rows if s.cfg.rollout.refill else c.prompts * c.samples
    return _kv_bytes(s, c.prompts * c.width + rows * slots)


def decode_step_bytes(s: Setup, slots: float) -> float:
    """HBM bytes one decode step reads per device: the sampler's weights (its compute-dtype
    copy, `Setup.sampling_copy`) and the KV cache of `slots` row slots (slot refill: each
    row its own prompt's, gathered from the store, and its own slots)."""
    c = sampler_calls(s.cfg)
    if s.cfg.rollout.refill:
        return s.sampling_copy + _kv_bytes(s, c.rows * (c.width + slots))
    return s.sampling_copy + kv_cache_bytes(s, slots)
