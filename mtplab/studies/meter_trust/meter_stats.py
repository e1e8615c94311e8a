"""The statistics of the meter's validation, numpy only (the report renders them on a
machine without a GPU): the overhead's ratios and intervals, the targets the figures are
checked against."""
from __future__ import annotations

import numpy as np

PLANTED_REL, PLANTED_ABS_US = 0.05, 10.0  # a planted delay read back within 5% of d or 10 µs
PROFILER_POINTS = 2.0                     # meter vs profiler, backlogged: within 2 points
OVERHEAD_PCT = 1.0                        # the meter costs at most 1% of decode tok/s


def planted_tolerance(d_us: float) -> float:
    """How far the meter's rise may sit from a planted delay of d_us (µs)."""
    return max(PLANTED_REL * d_us, PLANTED_ABS_US)


def overhead_ci(ratio: np.ndarray, rng) -> tuple[float, float, float]:
    """1 - median of per-repeat on/off ratios, % -> (overhead, bootstrap 95% interval)."""
    n = ratio.size
    boots = np.median(ratio[rng.integers(0, n, (4000, n))], axis=1)
    lo, hi = (1 - np.percentile(boots, [97.5, 2.5])) * 100
    return 100 * (1 - float(np.median(ratio))), float(lo), float(hi)


def arm_rate(r: dict, arm: str, k: int) -> np.ndarray:
    """An arm's figure per repeat: the geometric mean over its k engines."""
    return np.exp(np.mean([np.log(r[f"{arm} {i}"]) for i in range(k)], axis=0))


def engine_spread(r: dict, arm: str, k: int) -> float:
    """The arm's engine spread, %: (largest - smallest) / median of its engines' medians."""
    med = [float(np.median(r[f"{arm} {i}"])) for i in range(k)]
    return 100 * (max(med) - min(med)) / float(np.median(med))


# Student's t, 97.5th percentile, by degrees of freedom (1..30); beyond 30, 2.0
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def over_engines(runs: list, k: int) -> str:
    """The overhead with the engines as the sample: in each run (a dict of its engines'
    rates per repeat; a run's engines are its own), each engine's mean log rate relative to
    its repeat's mean over the on and off engines (the machine's drift cancels), then
    1 - exp(mean on - mean off) over the engines of all runs, with a t interval. Unlike the
    per-repeat interval, this counts how far one engine's own speed sits from another's."""
    n = k * len(runs)                                       # engines per arm
    if n < 2:
        return "- (1 engine per arm)"
    on, off = [], []
    for r in runs:
        logs = np.log(np.array([r[f"{a} {i}"] for a in ("on", "off") for i in range(k)]))
        rel = (logs - logs.mean(axis=0)).mean(axis=1)       # per engine, drift removed
        on += list(rel[:k])
        off += list(rel[k:])
    on, off = np.array(on), np.array(off)
    d = float(on.mean() - off.mean())
    se = float(np.sqrt(on.var(ddof=1) / n + off.var(ddof=1) / n))
    t = T975[2 * n - 3] if 2 * n - 2 <= len(T975) else 2.0
    ov = [100 * (1 - np.exp(x)) for x in (d, d + t * se, d - t * se)]
    return f"{ov[0]:.2f}% [{ov[1]:.2f}, {ov[2]:.2f}]"
