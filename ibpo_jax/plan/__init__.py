"""The plan of one RL step on named hardware: per-device memory, FLOPs and a roofline time.

`python -m ibpo_jax.plan --config=configs/ibpo_gspo.py:PRESET --hardware=NAME [--devices=N]
[--json] [--config.key=value ...]` (see `__main__`). `plan_json(cfg, hardware, devices)`
returns the same dict. Every program of one step is compiled from abstract inputs on the
preset's mesh (`programs.py`); a program's device peak is its compiled peak (arguments +
outputs - donated + temporaries, `compiled.memory_analysis()`) plus the resident state it does
not take as an argument (the Adam moments and the reference stay on the device while the
sampler runs). The step fits when every program's device peak is within the chip's usable HBM.

`optim.microbatches="auto"` resolves to the smallest micro-batch count whose update fits
(`resolve_microbatches`, also what the trainer calls at start-up).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ibpo_jax.trainer.errors import RunError

GIB = 2 ** 30
FAR = 2.0  # compiled vs DESIGN §9 figures further apart than this factor are printed
# Programs that take the sampler's bf16 weight copy: XLA:CPU converts it to float32 for its
# dots (a temporary of twice its bytes) where a GPU/TPU reads bf16 directly.
# (vouched_steps' continuation call has the same, named with `plan.vouch.PREFIX`)
SAMPLER_PROGRAMS = ("sampling weights", "prefill", "decode")


def _sampler_program(name: str, *more: str) -> bool:
    """Whether the program `name` is one of the sampler's (or of `more`), the continuation
    call's included."""
    from ibpo_jax.plan.vouch import PREFIX

    return name.removeprefix(PREFIX) in SAMPLER_PROGRAMS + more


class PlanError(ValueError):
    """Hardware, devices or mesh that the plan cannot use; the message is one line."""


def _mesh(cfg: Any, devices: int | None) -> Any:
    import jax

    from ibpo_jax.runtime import sharding

    avail = jax.devices()
    n = devices or len(avail)
    if n > len(avail):
        raise PlanError(f"--devices={n}: only {len(avail)} {jax.default_backend()} devices "
                        "here (on CPU, set XLA_FLAGS=--xla_force_host_platform_device_count="
                        f"{n} before jax starts, as `python -m ibpo_jax.plan` does)")
    m = cfg.mesh
    try:
        return sharding.make_mesh(data=m.data, fsdp=m.fsdp, tensor=m.tensor,
                                  devices=avail[:n])
    except ValueError as e:
        raise PlanError(f"config.mesh (data={m.data}, fsdp={m.fsdp}, tensor={m.tensor}) on "
                        f"{n} devices: {e}") from None


def microbatch_choices(cfg: Any, batch_devices: int) -> list[int]:
    """Micro-batch counts the config allows (whole groups per chunk), ascending; those whose
    micro-batch still spreads over every batch device first in kind (a smaller one leaves
    devices holding the whole micro-batch, which saves no memory)."""
    r, o = cfg.rollout, cfg.optim
    groups = r.prompts_per_step // o.minibatches
    ok = [m for m in range(1, groups + 1) if groups % m == 0]
    spread = [m for m in ok if (groups // m) % batch_devices == 0 or
              (groups // m * r.group_size) % batch_devices == 0]
    return spread or ok


def _capacity(chip: Any) -> int:
    return chip.usable_hbm


def _device_peak(prog: Any, resident: int) -> int:
    return prog.peak + max(resident - prog.resident_args, 0)


def _search_update(cfg: Any, mesh: Any, capacity: int, start: int, *, target: str = "cpu",
                   log=None) -> tuple[int | None, tuple | None, Any]:
    """Smallest micro-batch count >= start whose update fits `capacity` per device (binary
    search over `microbatch_choices`; each probe compiles the update): (count, (program,
    compiled), setup), or (None, None, setup of the largest count) when none fits."""
    from ibpo_jax.plan import programs

    choices = [m for m in microbatch_choices(cfg, mesh.shape["data"] * mesh.shape["fsdp"])
               if m >= start]
    if not choices:  # already at the most micro-batches the batch allows
        given = configured_microbatches(cfg, mesh)
        return None, None, programs.setup(cfg, mesh, given if given != "auto" else start,
                                          target)
    lo, hi = 0, len(choices) - 1
    tried, credit = {}, []  # φ's output, compiled once: the same for every count

    def probe(i):
        if i not in tried:
            s = programs.setup(cfg, mesh, choices[i], target)
            if not credit:
                credit.append(programs.compile_credit(s, force=True)[1])
            upd = programs.compile_update(s, credit[0], force=True)
            peak = _device_peak(upd[0], sum(s.resident.values()))
            if log:
                log(f"  update with optim.microbatches={choices[i]}: "
                    f"{peak / GIB:.2f} GiB per device")
            tried[i] = (peak <= capacity, upd, s)
        return tried[i]

    if not probe(0)[0]:
        if not probe(hi)[0]:
            return None, None, tried[hi][2]
        while lo + 1 < hi:  # probe(lo) fails, probe(hi) fits
            mid = (lo + hi) // 2
            if probe(mid)[0]:
                hi = mid
            else:
                lo = mid
        lo = hi
    best = (choices[lo], tried[lo][1], tried[lo][2])
    return best


def rows_microbatches(cfg: Any, batch_devices: int) -> int:
    """The micro-batch count of optim.micro_batch_rows: the fewest allowed (whole groups,
    `microbatch_choices`) whose micro-batch puts at most that many rows on each of the
    `batch_devices` (data x fsdp); the most allowed when even that puts more."""
    r, o = cfg.rollout, cfg.optim
    rows = r.prompts_per_step * r.group_size // o.minibatches
    choices = sorted(microbatch_choices(cfg, batch_devices))
    fits = [m for m in choices if -(-rows // (m * batch_devices)) <= o.micro_batch_rows]
    return fits[0] if fits else choices[-1]


def microbatches_knob(cfg: Any, mesh: Any, count: int) -> str:
    """The override that sets `count` micro-batches, in the config's own terms: rows per
    batch device when it counts micro-batches so (optim.micro_batch_rows), else the count."""
    if not cfg.optim.micro_batch_rows:
        return f"--config.optim.microbatches={count}"
    r, batch = cfg.rollout, mesh.shape["data"] * mesh.shape["fsdp"]
    rows = r.prompts_per_step * r.group_size // cfg.optim.minibatches
    return f"--config.optim.micro_batch_rows={max(1, -(-rows // (count * batch)))}"


def configured_microbatches(cfg: Any, mesh: Any) -> int | str:
    """The micro-batch count the config asks for on `mesh`: optim.micro_batch_rows' count
    (`rows_microbatches`), else optim.microbatches (an int or "auto")."""
    if cfg.optim.micro_batch_rows:
        return rows_microbatches(cfg, mesh.shape["data"] * mesh.shape["fsdp"])
    return cfg.optim.microbatches


def resolve_microbatches(cfg: Any, mesh: Any, capacity: int, *, target: str = "cpu",
                         log=None) -> int:
    """The micro-batch count as an int: the configured one (`configured_microbatches`), or for
    "auto" the smallest count whose update fits `capacity` bytes per device on `mesh` (the
    largest allowed when none does)."""
    given = configured_microbatches(cfg, mesh)
    if given != "auto":
        return given
    m, _, s = _search_update(cfg, mesh, capacity, 1, target=target, log=log)
    return m if m is not None else s.microbatches


def usable_bytes(device: Any) -> int | None:
    """The memory a JAX process may plan for on `device`: the allocator's limit where it
    reports one (GPU, TPU), else the chip table's usable HBM, else None (CPU)."""
    from ibpo_jax.runtime import chips

    stats = getattr(device, "memory_stats", lambda: None)()
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    chip = chips.from_device_kind(getattr(device, "device_kind", ""))
    return chip.usable_hbm if chip else None


def host_capacity(devices: int) -> int:
    """Per-device share of the host's available memory (CPU runs)."""
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        avail = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return avail // max(devices, 1)


def trainer_microbatches(cfg: Any, mesh: Any, *, log=None) -> int:
    """What the trainer runs: the configured count (`configured_microbatches`), or "auto"
    resolved on the run's own devices. Cheap for small configs: DESIGN §9's estimate of the
    update with one micro-batch, when under a quarter of the memory, settles it without
    compiling."""
    given = configured_microbatches(cfg, mesh)
    if given != "auto":
        return given
    from ibpo_jax.plan import flops as flops_lib
    from ibpo_jax.plan import programs

    devices = mesh.devices.size
    capacity = usable_bytes(mesh.devices.flat[0]) or host_capacity(devices)
    target = mesh.devices.flat[0].platform
    config, options, _ = programs.model_of(cfg, target)
    est = _analytic(cfg, config, options, mesh, 1, flops_lib)
    if est.update_peak + est.kv_cache <= capacity / 4:
        return 1
    return resolve_microbatches(cfg, mesh, capacity, target=target, log=log)


class HostMemoryError(RunError):
    """A CPU run whose plan does not fit the host's available memory (one line, the knob)."""


def startup_microbatches(cfg: Any, mesh: Any, *, log=None) -> int:
    """What the trainer calls before it loads anything: optim.microbatches resolved
    (`trainer_microbatches`) and, on the CPU backend, the run's memory checked against the
    host's (`check_host_memory`)."""
    mb = trainer_microbatches(cfg, mesh, log=log)
    check_host_memory(cfg, mesh, mb)
    return mb


def check_host_memory(cfg: Any, mesh: Any, microbatches: int) -> None:
    """Raises HostMemoryError when a CPU run will not fit the memory the host has available:
    on the CPU backend device memory is the host's, so the update's compiled peak per device
    times this process's devices, plus a checkpoint's host copy of the train state (orbax
    copies params and Adam moments to host buffers while the step's memory stays held:
    experiments/benchmarks/host_memory.py), must fit `MemAvailable`. Cheap for small runs:
    DESIGN §9's estimate under a quarter of it settles it without compiling. A config the
    plan cannot model (a tiny model on another task's tokenizer) is not checked."""
    import jax

    from ibpo_jax.plan import flops as flops_lib
    from ibpo_jax.plan import programs

    if mesh.devices.flat[0].platform != "cpu":
        return
    try:
        config, options, _ = programs.model_of(cfg, "cpu")
    except ValueError:
        return
    local, available = jax.local_device_count(), host_capacity(1)
    est = _analytic(cfg, config, options, mesh, microbatches, flops_lib)
    if (est.update_peak + est.kv_cache + est.master + est.adam) * local <= available / 4:
        return
    s = programs.setup(cfg, mesh, microbatches, "cpu")
    update = programs.compile_update(s, programs.compile_credit(s, force=True)[1], force=True)
    peak = _device_peak(update[0], sum(s.resident.values()))
    copy = s.resident["params"] + s.resident["adam"]
    need = (peak + copy) * local
    if need <= available:
        return
    m, _, _ = _search_update(cfg, mesh, available // local - copy, microbatches + 1)
    fix = (f"set {microbatches_knob(cfg, mesh, m)} (or more micro-batches)" if m is not None
           else "train LoRA adapters (--config.model.lora.rank), or on a host with more memory")
    raise HostMemoryError(
        f"this run needs about {need / GIB:.1f} GiB of host memory, {available / GIB:.1f} GiB "
        f"are available: the update's peak {peak / GIB:.2f} GiB per device x {local} "
        f"device(s) ({microbatches} micro-batch{'es' if microbatches > 1 else ''}) and a "
        f"checkpoint's host copy of the train state, {copy / GIB:.2f} GiB per device; {fix}")


def _analytic(cfg: Any, config: Any, options: Any, mesh: Any, microbatches: int,
              flops_lib: Any) -> Any:
    import numpy as np

    from ibpo_jax.models import lora

    r, sh = cfg.rollout, mesh.shape
    pbytes = np.dtype(options.param_dtype).itemsize
    return flops_lib.analytic(
        config, n_params=config.num_params(), rows=r.prompts_per_step * r.group_size,
        prompt=r.max_prompt_len, response=r.max_new_tokens, group=r.group_size,
        devices=mesh.devices.size, param_shards=sh["fsdp"] * sh["tensor"],
        sample_shards=sh["tensor"], param_bytes=pbytes,
        ref_bytes=min(pbytes, np.dtype(options.dtype).itemsize),
        sample_bytes=np.dtype(options.dtype).itemsize,
        microbatches=microbatches, remat=options.remat, logits_chunk=cfg.model.logits_chunk,
        sample_rows=(r.sample_chunk or r.prompts_per_step) * r.group_size,
        trained=lora.num_params(config, cfg.model.lora.rank, lora.parse_targets(
            cfg.model.lora.targets)) if cfg.model.lora.rank else None)


def plan_json(cfg: Any, hardware: str, devices: int | None = None, *, log=None,
              only: tuple[str, ...] | None = None, lengths: str = "paper") -> dict:
    """The plan of one RL step of `cfg` on `devices` chips called `hardware` (chips.chip):
    {fits, hbm_bytes_per_device, peak_bytes_per_device, programs (name -> device peak
    bytes), flops_per_step, predicted_step_s, devices, hardware, attention, ...; and, when it
    does not fit, `error` (one line naming the program, the bytes and the knob)}. Raises
    PlanError (one line) for hardware, devices or mesh it cannot use. `only`: compile just
    these programs (e.g. ("update", "decode"), for tests) and those whose outputs they take
    (`programs.FEEDS`: the shardings of their inputs), with the same figures as the full
    plan; the others count FLOPs only. `lengths` ("paper", "metrics:PATH" or "max"): the
    response lengths the step time is also given for (`lengths.step_times`; "max": the worst
    case only)."""
    from ibpo_jax.plan import programs
    from ibpo_jax.runtime import chips

    try:
        chip = chips.chip(hardware)
    except chips.UnknownChipError as e:
        raise PlanError(str(e)) from None
    from ibpo_jax.plan import lengths as lengths_lib

    observed = None if lengths == "max" else lengths_lib.load(lengths, cfg)  # before compiling
    mesh = _mesh(cfg, devices)
    programs.LOG, programs.ONLY = log, programs.compiled_names(only)
    try:
        out = _plan(cfg, chip, mesh, only, log)
    finally:  # module state: a later search (the trainer's "auto") compiles everything
        programs.LOG, programs.ONLY = None, None
    if observed is not None:
        out["lengths"] = lengths_lib.step_times(
            lengths, observed, cfg, *out["decode_roofline"], out["predicted_step_s"],
            prefill_token_s=out["prefill_token_s"])
    return out


def _plan(cfg: Any, chip: Any, mesh: Any, only: tuple[str, ...] | None, log) -> dict:
    import jax

    from ibpo_jax.plan import flops as flops_lib
    from ibpo_jax.plan import programs, vouch

    n_dev = mesh.devices.size
    capacity = _capacity(chip)
    mb, target = configured_microbatches(cfg, mesh), chip.platform
    if mb == "auto":
        found, upd, s = _search_update(cfg, mesh, capacity, 1, target=target, log=log)
        mb = found if found is not None else s.microbatches
    else:
        s, upd = programs.setup(cfg, mesh, mb, target), None
    progs = programs.compile_all(s, update=upd, extra=(vouch.programs,))
    resident = s.resident
    rows = _program_table(progs, s, chip, n_dev, sum(resident.values()))
    # FLOPs and time count every program; memory only what was compiled (`only`)
    t_total = sum((row["runs"] * row["roofline_s_per_run"] for row in rows), 0.0)
    f_total = sum((row["runs"] * row["flops_per_run"] for row in rows), 0.0)
    table = [row for row in rows if only is None or row["note"] != "not compiled"]
    worst = max(table, key=lambda row: row["device_peak"])
    kv_full, calls = programs.kv_cache_bytes(s), programs.sampler_calls(cfg)
    est = _analytic(cfg, s.config, s.options, mesh, mb, flops_lib)
    out = {
        "fits": worst["device_peak"] <= capacity,
        "hardware": chip.name, "devices": n_dev, "mesh": dict(mesh.shape),
        "backend": jax.default_backend(), "attention": s.attention,
        "microbatches": mb, "remat": s.options.remat,
        "sample_chunk": cfg.rollout.sample_chunk or cfg.rollout.prompts_per_step,
        "hbm_bytes_per_device": capacity, "hbm_total_bytes_per_device": chip.hbm_bytes,
        "peak_bytes_per_device": worst["device_peak"], "peak_program": worst["name"],
        "programs": {row["name"]: row["device_peak"] for row in table
                     if row["name"] != "score"},  # score's memory is the update's
        "program_details": table,
        "resident_bytes_per_device": {**resident, "sampling_copy": s.sampling_copy,
                                      "kv_cache_full": kv_full},
        "flops_per_step": f_total, "predicted_step_s": t_total,
        "decode_roofline": next((r["roofline_s_per_run"], r["runs"]) for r in rows
                                if r["name"] == "decode"),  # (s per step, steps): every row
        # a prompt token's share of a prefill: what re-encoding a prefix costs
        "prefill_token_s": next(r["roofline_s_per_run"] for r in rows
                                if r["name"] == "prefill") / (calls.prompts * calls.width),
        "peak_bytes_per_device_without_cpu_weight_upcast": max(
            r["device_peak"] - r["cpu_weight_upcast_estimate"] for r in table),
        "analytic": dataclasses.asdict(est) | {"update_peak": est.update_peak},
        "notes": notes(s),
    }
    out["disagreements"] = disagreements(out, est, table)
    if not out["fits"]:
        out["error"] = not_fitting(cfg, mesh, worst, capacity, s, target, log=log)
    return out


def _program_table(progs: list, s: Any, chip: Any, n_dev: int, res_total: int) -> list[dict]:
    """One row per program: its memory (device peak with the resident state), FLOPs, HBM
    bytes and roofline time per run, and XLA:CPU's estimated float32 weight upcast."""
    import jax

    table = []
    peak_flops, bw = chip.bf16_flops, chip.hbm_bytes_per_s
    upcast = jax.default_backend() == "cpu" and chip.platform != "cpu"
    for p in progs:
        flops = max(p.count.flops, p.xla_flops)
        hbm = p.hbm_bytes if p.hbm_bytes is not None else max(p.count.bytes, p.xla_bytes) / n_dev
        t = max(flops / (n_dev * peak_flops), hbm / bw)
        # XLA:CPU's float32 copy of the bf16 weights (docs/plan.md)
        copy = 2 * s.sampling_copy if upcast and _sampler_program(p.name) else 0
        table.append({"name": p.name, "argument": p.argument, "output": p.output,
                      "alias": p.alias, "temp": p.temp, "peak": p.peak,
                      "device_peak": _device_peak(p, res_total), "runs": p.runs,
                      "flops_per_run": flops, "xla_cost_analysis_flops": p.xla_flops,
                      "hbm_bytes_per_run": hbm, "roofline_s_per_run": t,
                      "bound": "compute" if flops / (n_dev * peak_flops) >= hbm / bw
                      else "memory", "note": p.note,
                      "cpu_weight_upcast_estimate": min(copy, p.temp)})
    return table


def notes(s: Any) -> list[str]:
    import jax

    from ibpo_jax.core import comparison

    ref = {a.dtype.name for a in jax.tree.leaves(s.reference)}
    lora = s.options.lora_rank
    state = s.resident["params"] + s.resident["adam"]
    out = [f"LoRA rank {lora}: the state is the adapters and their Adam moments; the reference "
           f"is the frozen base itself ({'/'.join(sorted(ref))}), no copy" if lora else
           f"reference model: {'/'.join(sorted(ref))} leaves, as the trainer holds it "
           "(trainer.state.frozen_reference: matrices in the compute dtype)",
           "sampling copy: the sampler's compute-dtype weights (sampling.compute_weights), "
           "made per rollout; an argument of prefill and decode, counted there",
           f"host memory: a checkpoint copies the train state, {state / GIB:.2f} GiB per "
           "device, to the host while it saves (a CPU run's device memory: the trainer adds "
           "it to the update's peak and refuses a run that does not fit, check_host_memory)"]
    if s.cfg.ibpo.operator in comparison.NEEDS_VOUCHED:
        out.append(f"{s.cfg.ibpo.operator}: its continuation calls are compiled per call "
                   "(vouch: prefill, vouch: decode), with no runs in the step's time: a step "
                   "makes as many as its wrong responses' walks ask (on countdown, 4.5x a "
                   "step's rollouts)")
    if jax.default_backend() == "cpu":
        out.append("compiled by XLA:CPU on simulated devices: its temporaries may hold "
                   "float32 upcasts of bfloat16 values that a GPU/TPU compile would not "
                   "(docs/plan.md measures by how much)")
    return out


def disagreements(out: dict, est: Any, table: list[dict]) -> list[str]:
    """Lines where the compiled figures and DESIGN §9's differ by more than FAR."""
    rows = {r["name"]: r for r in table}
    pairs = [("FLOPs per step", out["flops_per_step"], est.flops)]
    if "update" in rows:
        pairs.insert(0, ("update peak bytes per device", rows["update"]["device_peak"],
                         est.update_peak))
    lines = []
    for what, compiled, model in pairs:
        if model > 0 and not 1 / FAR <= compiled / model <= FAR:
            lines.append(f"{what}: compiled {compiled:.3g}, DESIGN §9 {model:.3g} "
                         f"({compiled / model:.2f}x)")
    return lines


def not_fitting(cfg: Any, mesh: Any, worst: dict, capacity: int, s: Any, target: str, *,
                log=None) -> str:
    """One line: the program that does not fit, bytes needed and available, and a knob that
    makes it fit: for the update, found by compiling (micro-batches, then remat "full"),
    else the device count its figures imply; for the sampler's programs, the mesh.tensor
    that splits its weights enough."""
    need, name = worst["device_peak"], worst["name"]
    head = (f"{name} needs {need / GIB:.1f} GiB per device, {capacity / GIB:.1f} GiB "
            "available")
    if name in ("update", "score"):
        m, _, _ = _search_update(cfg, mesh, capacity, s.microbatches + 1, target=target,
                                 log=log)
        if m is not None:
            return f"{head}: set {microbatches_knob(cfg, mesh, m)} (or more micro-batches)"
        if cfg.model.remat != "full":
            full = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, remat="full"))
            m, _, _ = _search_update(full, mesh, capacity, s.microbatches, target=target,
                                     log=log)
            if m is not None:
                return (f"{head}: set --config.model.remat=full "
                        f"{microbatches_knob(cfg, mesh, m)}")
    devices, tensor = mesh.devices.size, mesh.shape["tensor"]
    if _sampler_program(name, "decode: grow cache"):
        # The sampler's weights are whole on each batch replica: only `tensor` splits them
        # (with XLA:CPU's float32 copy of them, 3x the copy's bytes in all).
        upcast = worst.get("cpu_weight_upcast_estimate", 0)
        weights = s.sampling_copy + upcast
        rest = need - weights
        if rest < capacity:
            t = tensor * -(-weights // (capacity - rest))
            return (f"{head}: set --config.mesh.tensor={t} (or more; the sampler's weights, "
                    f"{weights / GIB:.1f} GiB per device, split over it) or a smaller "
                    "--config.rollout.sample_chunk")
        return f"{head}: set a smaller --config.rollout.sample_chunk and more mesh.tensor"
    # What the update holds per device (state, gradients, its micro-batch's rows) shards over
    # fsdp: about 1/devices.
    more = -(-devices * need // capacity)
    more = -(-more // tensor) * tensor
    return (f"{head}: more devices: about {more} (mesh.fsdp fills them; the update's state, "
            "gradients and micro-batch rows shard over fsdp)")

