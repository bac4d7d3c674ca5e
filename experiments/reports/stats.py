"""The one statistical rule every item's verdict uses (stated in experiments/results/README.md).

A comparison is a linear contrast of seed means, d = Σ c_i · mean_i − ref: a difference of two
runs (c = +1, −1), a difference of two differences (C.1's gain at two sizes), or one run
against a constant (Appendix A's Cov(Y, φ) < 0). Its standard error is the unpooled
se² = Σ c_i² s_i² / n_i, its degrees of freedom Welch–Satterthwaite's
ν = se⁴ / Σ (c_i² s_i² / n_i)² / (n_i − 1), and it reports d, the 95 % interval
d ± t_{0.975, ν} · se, the two-sided Welch p-value of t = d / se, and the p-value
Holm-adjusted within the item's comparisons (`holm`). A comparison goes "higher" / "lower" only
when its adjusted p < 0.05; otherwise it is "level", with the smallest effect its seed counts
detect (`mde`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from scipy import stats as sp  # in .venv as a dependency of jax

ALPHA, POWER = 0.05, 0.8


def mean_sd(xs: list[float]) -> tuple[float, float]:
    """(mean, sample sd); sd is nan for one value, both nan for none."""
    if not xs:
        return math.nan, math.nan
    return statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else math.nan


@dataclasses.dataclass(frozen=True)
class Test:
    """A contrast's estimate and test (nan where a term has fewer than 2 values)."""

    diff: float
    low: float  # 95 % interval
    high: float
    p: float  # two-sided Welch p
    df: float
    mde: float  # smallest |diff| detected at power POWER, two-sided ALPHA (`mde`)


def welch_df(*, variances: list[float], ns: list[int]) -> float:
    """Welch–Satterthwaite ν of Σ v_i, each v_i = c_i² s_i² / n_i with n_i − 1 df."""
    num = sum(variances) ** 2
    den = sum(v**2 / (n - 1) for v, n in zip(variances, ns))
    return num / den if den > 0 else math.nan


def mde(*, sd: float, coefs: list[float], ns: list[int], alpha: float = ALPHA,
        power: float = POWER) -> float:
    """The smallest true |contrast| a two-sided Welch test at `alpha` detects with probability
    `power`, every term at the common sd `sd` (the pooled sd): with se = sd · √(Σ c_i² / n_i)
    and ν the Welch–Satterthwaite df at equal sds,
        MDE = (t_{1 − α/2, ν} + t_{power, ν}) · se,
    the usual t approximation of the noncentral t (exact as ν → ∞, slightly small for ν ≈ 2:
    a lower bound on what the seeds can detect)."""
    weights = [c**2 / n for c, n in zip(coefs, ns)]
    se = sd * math.sqrt(sum(weights))
    if se == 0:
        return 0.0
    df = welch_df(variances=weights, ns=ns)
    return float((sp.t.ppf(1 - alpha / 2, df) + sp.t.ppf(power, df)) * se)


def pooled_sd(groups: list[list[float]]) -> float:
    """√(Σ (n_i − 1) s_i² / Σ (n_i − 1)) over groups of ≥ 2 values."""
    dof = sum(len(g) - 1 for g in groups)
    ss = sum((len(g) - 1) * statistics.variance(g) for g in groups)
    return math.sqrt(ss / dof) if dof else math.nan


def contrast(*, terms: list[tuple[float, list[float]]], ref: float = 0.0) -> Test:
    """Welch's test of Σ c_i · mean(x_i) = ref (see the module docstring); all nan when a term
    has fewer than 2 values. With no spread on any side the difference is exact: p = 0 when
    it is not 0, else 1."""
    if any(len(x) < 2 for _, x in terms):
        return Test(*(math.nan,) * 6)
    d = sum(c * statistics.mean(x) for c, x in terms) - ref
    v = [c**2 * statistics.variance(x) / len(x) for c, x in terms]
    ns = [len(x) for _, x in terms]
    power_mde = mde(sd=pooled_sd([x for _, x in terms]), coefs=[c for c, _ in terms], ns=ns)
    se = math.sqrt(sum(v))
    if se == 0:
        return Test(d, d, d, float(d == 0), math.nan, power_mde)
    df = welch_df(variances=v, ns=ns)
    half = float(sp.t.ppf(0.975, df)) * se
    p = float(2 * sp.t.sf(abs(d) / se, df))
    return Test(d, d - half, d + half, p, df, power_mde)


def welch(a: list[float], b: list[float]) -> Test:
    """mean(a) − mean(b), Welch's two-sample test."""
    return contrast(terms=[(1.0, a), (-1.0, b)])


def holm(ps: list[float], m: int) -> list[float]:
    """Holm-adjusted p-values of `ps` (in their order) in a family of m ≥ len(ps) hypotheses.
    The m - len(ps) not tested yet count as the largest p-values: an adjusted p so computed
    can only fall once they are tested, so a "higher" / "lower" found early stands."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, running = [1.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out


def direction(*, test: Test, adjusted_p: float, alpha: float = ALPHA) -> str:
    """"higher" / "lower" at Holm-adjusted p < alpha, else "level"."""
    if adjusted_p < alpha:
        return "higher" if test.diff > 0 else "lower"
    return "level"


def paired(diffs: list[float]) -> Test:
    """mean(d) over the per-seed differences d_s = a_s − b_s of a paired design (issue 57): the
    one-sample t test of mean(d) = 0 with n − 1 df, its 95 % interval, and the smallest true
    |mean(d)| detected at power POWER, two-sided ALPHA: (t_{1−α/2} + t_{power}) · sd(d) / √n.
    All nan below 2 pairs; with no spread the difference is exact (p 0 unless it is 0)."""
    n = len(diffs)
    if n < 2:
        return Test(*(math.nan,) * 6)
    d, sd = statistics.mean(diffs), statistics.stdev(diffs)
    se, df = sd / math.sqrt(n), n - 1
    detect = float((sp.t.ppf(1 - ALPHA / 2, df) + sp.t.ppf(POWER, df)) * se)
    if se == 0:
        return Test(d, d, d, float(d == 0), df, detect)
    half = float(sp.t.ppf(0.975, df)) * se
    return Test(d, d - half, d + half, float(2 * sp.t.sf(abs(d) / se, df)), df, detect)
