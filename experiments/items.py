"""What a reproduction item is: its runs, what it reads, how it is judged (DESIGN §8).

The declarations live elsewhere, this module below them: the papers' items in
`experiments/items_paper.py`, the issues' own questions (#45's recipe, #46's scale) in
`experiments/items_recipe.py`, and `ITEMS`, the one ordered registry of them all that the driver
and the reports read, in `experiments/items_registry.py`.

A `Run` is one training configuration: an algorithm's config file plus overrides. Items share
runs (plain GSPO serves Table 2a, Table 2b, C.2, §4.2, C.1, C.3, C.4, `variants`, `recipe` and
`scale`), so a run's directory is named by its configuration, not by the item, and each is
trained once. Items whose method does not exist in the code yet say so (`needs`) and are
reported as not run, never faked.

An item is one `Item` in `ITEMS` (in the summary table's order, `ORDER`): its runs, the
per-step keys it tabulates (`metrics`) and further ones its records keep (`keeps`; records keep
the union over the items, `reproduce.kept()`), its claim as `comparisons` (each reads
`SUMMARY_VALUES` or its `metrics`, checked when declared) with its rule (`some`; comparisons
with `expect=NO_CLAIM` where the paper says nothing, judged as a plain statement), the tasks it
runs on (`tasks`; "not planned" elsewhere), and optional hooks, which `reproduce.py` and
`report.py` call without knowing the item:

- `notes`: `(summaries) -> str`, a sentence for the verdict line
  (experiments/reports/item_notes.py).
- `sections`: `(ctx: ProbeContext) -> list[str]`, Markdown appended to the item's page.
- `probe`: `(ctx: ProbeContext) -> list[Path]`, for an item that measures instead of training
  a grid: it writes the page itself (`ctx.out_dir / f"{name}.md"`, `{name}.json` with at least
  {"verdict": ...} for the summary, figures) and returns the paths ([] without records: the
  summary says "not run yet"). Its records are `ctx.records_dir / f"<stem>_s<seed>.json"`
  (`base_probe.seed_records`), measured when missing and `ctx.measure` (False under
  --report-only). It runs once the whole command's pool has trained, so it may read other
  items' final checkpoints at `ctx.workdir(run, seed)` (where that run trained on this
  machine); runs it lists itself train first.

A hook in a module that imports jax (or this one) is `Lazy("module:function")`, e.g.
`probe=Lazy("experiments.probes.credit_probe:probe")`.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Run:
    """One configuration. `label` names it in tables; `name` its directory (unique per config)."""

    label: str
    algo: str  # configs/<algo>.py
    overrides: tuple[tuple[str, str], ...] = ()
    max_seeds: int = 0  # fewer seeds than the item's for this run (0 = the item's), and why:
    why_fewer: str = ""  # said in the results file
    by_task: tuple[tuple[str, str, str], ...] = ()  # (task, key, value): one task's overrides
    min_seeds: int = 0  # more seeds than the item's for this run (a pair the item rests on)
    tasks: tuple[str, ...] = ()  # the --task values it trains on (() = its item's)

    def on(self, task: str) -> bool:
        """Whether the run belongs to its item on `task`."""
        return not self.tasks or task in self.tasks

    def seeds(self, item_seeds: int) -> int:
        """The seeds this run trains and reports when its item asks for `item_seeds`."""
        n = max(item_seeds, self.min_seeds)
        return min(n, self.max_seeds) if self.max_seeds else n

    def overrides_on(self, task: str) -> tuple[tuple[str, str], ...]:
        return self.overrides + tuple((k, v) for t, k, v in self.by_task if t == task)

    @property
    def name(self) -> str:
        parts = [self.algo] + [f"{k.split('.')[-1]}={v}" for k, v in self.overrides]
        return "__".join(parts).replace("/", "_")


def run(label: str, algo: str, **overrides) -> Run:
    """run("λ=0.3", "ibpo_gspo", **{"ibpo.lam": 0.3})"""
    return Run(label, algo, tuple(sorted((k, str(v)) for k, v in overrides.items())))


# A comparison's `expect` where the paper makes no claim: reported as found ("higher",
# "lower", "level"), never counted for or against the paper.
NO_CLAIM = "no claim"


@dataclasses.dataclass(frozen=True)
class Comparison:
    """A contrast Σ coef · (seed mean of `metric` of run `label`) − ref the paper says is
    above 0 (`expect` "higher") or below (`expect` "lower"), or about which it says nothing
    (`NO_CLAIM`). `metric` is a per-seed value of report.summarize: "final" accuracy, "early"
    (accuracy at the last evaluation within the paper's 150 / 400 of the steps), or a per-step
    metric's mean over the run."""

    name: str
    terms: tuple[tuple[float, str, str], ...]  # (coef, run label, metric)
    expect: str = "higher"
    ref: float = 0.0

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(label for _, label, _ in self.terms)


def vs(a: str, b: str, *, metric: str = "final", expect: str = "higher") -> Comparison:
    """Run a against run b."""
    return Comparison(f"{a} vs {b}", ((1.0, a, metric), (-1.0, b, metric)), expect)


def did(a: str, b: str, c: str, d: str, *, name: str, metric: str = "final",
        expect: str = "higher") -> Comparison:
    """A difference of differences, (a − b) − (c − d): whether b -> a's effect is larger
    than d -> c's (an interaction, e.g. IBPO's gain with dynamic sampling against without)."""
    return Comparison(name, ((1.0, a, metric), (-1.0, b, metric), (-1.0, c, metric),
                             (1.0, d, metric)), expect)


# The per-seed values `report.summarize` derives from a run's evaluations (`eval_accuracy`),
# which a comparison may read besides the item's own `metrics`.
SUMMARY_VALUES = ("base", "final", "gain", "early")


@dataclasses.dataclass(frozen=True)
class Lazy:
    """A hook named "module:function", imported when first called: the probes import jax and
    the report imports this module, so the items name their hooks without importing them."""

    target: str

    def resolve(self) -> Callable:
        module, _, name = self.target.partition(":")
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            raise LookupError(f"hook {self.target}: {e}") from None

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)


Note = Callable[[dict[str, dict]], str]
Section = Callable[["ProbeContext"], list[str]]
Probe = Callable[["ProbeContext"], list[Path]]


@dataclasses.dataclass(frozen=True)
class FinalsAxis:
    """Where the figure's final-accuracy panel places each run, instead of one tick per run
    (the paper's Fig. 2: final accuracy against λ)."""

    name: str  # in the panel's title: "final accuracy ... vs <name>"
    label: str  # the x-axis label
    position: Callable[[str], float | None]  # run label -> x (None: off the paper's curve)


@dataclasses.dataclass(frozen=True)
class Item:
    """A table or figure of a paper, reproduced in miniature (one entry of `ITEMS`; the hooks
    are described in the module docstring)."""

    name: str
    title: str
    runs: tuple[Run, ...]
    paper: dict[str, str]  # label -> the paper's number or direction
    claim: str  # the paper's claim in words
    min_seeds: int = 2
    needs: str = ""  # a config file or keys (comma-separated) it needs; "" = available
    metrics: tuple[str, ...] = ()  # extra per-step keys to tabulate (mean over logged steps)
    # The claim as comparisons the paper says go its way (experiments/reports/stats.py tests each).
    comparisons: tuple[Comparison, ...] = ()
    some: bool = False  # the claim is "some comparison wins", not "every comparison does"
    panels: tuple[tuple[str, ...], ...] = ()  # the plot's runs per panel (default: plots.py)
    keeps: tuple[str, ...] = ()  # per-step keys its records keep, untabulated (raw diagnostics)
    notes: tuple[Note, ...] = ()  # sentences the verdict adds, read from the summaries
    sections: tuple[Section, ...] = ()  # Markdown appended to its page
    probe: Probe | None = None  # writes its page (a measurement, not a training grid)
    finals_axis: FinalsAxis | None = None  # the final-accuracy panel's x (default: a tick a run)
    tasks: tuple[str, ...] = ()  # the --task values it runs on (() = every task)
    # Its runs sample different numbers of trajectories per step (dynamic sampling): the
    # table also says how many trajectories each took to reach the baseline's final.
    speed_in_trajectories: bool = False
    smoke: tuple[str, ...] = ()  # the runs --smoke trains (labels; default: the first run),
    # those that exercise what the item adds when its first run is a plain baseline
    # A paired design (issue 57): its runs are its own (records under runs/<task>/paired/,
    # never shared with another item's), trained seed by seed, every arm of a seed on one
    # host at one commit, and compared on the per-seed differences (experiments/reports/paired.py).
    paired: bool = False

    def __post_init__(self) -> None:
        labels = {r.label for r in self.runs}
        if unknown := set(self.smoke) - labels:
            raise ValueError(f"item {self.name}: smoke names {', '.join(sorted(unknown))}, "
                             f"not among its runs ({', '.join(labels)})")
        for c in self.comparisons:
            for _, label, metric in c.terms:
                if label not in labels:
                    raise ValueError(f"item {self.name}: comparison {c.name} reads run "
                                     f"{label!r}, not one of its runs ({', '.join(labels)})")
                if metric not in (*SUMMARY_VALUES, *self.metrics):
                    raise ValueError(f"item {self.name}: comparison {c.name} reads {metric!r}, "
                                     f"neither one of {', '.join(SUMMARY_VALUES)} nor one of "
                                     "its `metrics` (which its records keep)")

    @property
    def smoke_runs(self) -> tuple[Run, ...]:
        """The runs `reproduce --smoke` trains: those labelled `smoke`, else the first."""
        return tuple(r for r in self.runs if r.label in self.smoke) or self.runs[:1]

    @property
    def claimless(self) -> bool:
        """The paper makes no claim here: every comparison is `NO_CLAIM`."""
        return bool(self.comparisons) and all(c.expect == NO_CLAIM for c in self.comparisons)

    def runs_on(self, task: str) -> tuple[Run, ...]:
        """Its runs that train on `task` (`Run.tasks`)."""
        return tuple(r for r in self.runs if r.on(task))

    def planned(self, task: str) -> bool:
        """Whether the item runs on `task`."""
        return not self.tasks or task in self.tasks

    def missing(self) -> str:
        """Why the item cannot run in this code, or "": `needs` names a config file or one or
        more config keys ("section.key" or "section.sub.key", comma-separated)."""
        if not self.needs:
            return ""
        if self.needs.endswith(".py"):
            return "" if (ROOT / self.needs).exists() else f"{self.needs} does not exist yet"
        from configs import base  # the config schema: is the key there?

        cfg = base.make("gspo")
        for need in self.needs.split(","):
            *path, key = need.strip().split(".")
            section = cfg
            for part in path:
                section = section.get(part) if hasattr(section, "get") else None
            if not (hasattr(section, "keys") and key in section):
                return f"config key {need.strip()} does not exist yet"
        return ""


@dataclasses.dataclass(frozen=True)
class ProbeContext:
    """What `reproduce` hands an item's `probe` and `sections` hooks."""

    item: Item
    task: str  # --task
    preset: str  # the config preset and overrides of its trainers (--smoke: the smoke preset)
    extra: tuple[tuple[str, str], ...]
    seeds: int  # seeds the item reports: min_seeds, --seeds, or all recorded for its runs
    asked: int  # seeds the command asked for (--seeds or min_seeds): what a section measures
    smoke: bool  # a seconds-long check: measure as little as still runs the code
    measure: bool  # False under --report-only: read the records there are, measure nothing
    records_dir: Path  # <out>/runs/<task>/: run and probe records
    runs_dir: Path  # the trainers' workdirs, runs/reproduce/<task>/ (--smoke: under --out)
    out_dir: Path  # <out>/<task>/: the item's page
    command: str  # the command line that reproduces the item, for its page

    def workdir(self, run: Run, seed: int) -> Path:
        """A run's trainer workdir (config.json, metrics.jsonl, checkpoints/)."""
        return self.runs_dir / f"{run.name}_s{seed}"

    def record(self, run: Run, seed: int) -> Path:
        """A run's record (written when it finished)."""
        return self.records_dir / f"{run.name}_s{seed}.json"


def declare(*items: Item) -> dict[str, Item]:
    """The items by name, in declaration order; a name declared twice is an error."""
    out: dict[str, Item] = {}
    for item in items:
        if item.name in out:
            raise ValueError(f"item {item.name} is declared twice")
        out[item.name] = item
    return out


# Every record keeps its run's training curves, whichever item trains it (read by hand: the
# notes in docs/results_notes.md).
TRAINING_CURVES = ("reward_mean", "accuracy", "entropy", "response_len_mean", "phi_mean",
                   "units_truncated_frac", "update_tokens_frac")


def kept(always: tuple[str, ...], items: Iterable[Item]) -> tuple[str, ...]:
    """The per-step keys records keep: `always`, the training curves, the `items`' own."""
    keys = dict.fromkeys((*always, *TRAINING_CURVES))
    for item in items:
        keys.update(dict.fromkeys((*item.metrics, *item.keeps)))
    return tuple(keys)


