"""Uncertainty over seeds and the significance of a ranking, as pure functions.

A leaderboard row is a handful of seeds. Its mean alone cannot say whether the lead of one method
over another is real or noise; these functions can:

* :func:`bootstrap_ci`: a **percentile bootstrap** interval over seeds. Each resample draws as
  many seeds as there are, with replacement, and carries each drawn seed's *whole tuple* of values
  (its accuracies, and the random baseline and full-data accuracies evaluated with the same seed);
  the statistic is recomputed from the resampled tuples. A score that is non-linear in the
  accuracies (LRS, ARS, CREI) is therefore recomputed per resample from accuracies, never built
  from the intervals of its parts. The interval is the (1 - level) / 2 and (1 + level) / 2
  percentiles of the ``resamples`` statistics, drawn with the stated ``seed`` (reproducible).
* :func:`bootstrap_mean_intervals`: the same for the mean over seeds of many columns at once
  (vectorised; what every leaderboard row shows). The same draws as :func:`bootstrap_ci`.
* :func:`paired_difference`: the difference of two rows' statistics, resampling the seeds they
  share *jointly* (paired: seed ``s`` of both trained with the same initialisation, batch order and
  random baseline), with its interval and a significance flag (the interval excludes 0).
* :func:`rank_groups`: rank = 1 + the number of rows significantly better (so ties read 1, 1, 3),
  and the rows each one is tied with.
* :func:`kendall_tau`, :func:`rank_stability`: Kendall's tau-b between rankings (across
  architectures, seeds, score weights).

With few seeds the percentile bootstrap is optimistic: 3 seeds give only 10 distinct resamples and
an interval no wider than the seeds' range. The number of seeds is reported next to every interval;
read an interval from 3 seeds as a lower bound on the uncertainty. One seed gives no interval (NaN).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import scipy.stats

__all__ = ["RESAMPLES", "LEVEL", "SEED", "METHOD", "Interval", "Comparison", "bootstrap_ci",
           "bootstrap_mean_intervals", "paired_difference", "rank_groups", "kendall_tau", "rank_stability",
           "describe_method"]

RESAMPLES = 2000  # bootstrap resamples per interval
LEVEL = 0.95  # two-sided confidence level
SEED = 0  # of the resampling generator: the same data give the same interval
METHOD = "percentile bootstrap over seeds"


def describe_method(resamples: int = RESAMPLES, level: float = LEVEL, seed: int = SEED,
                    seeds: Sequence[int] | None = None) -> str:
    """One sentence for a caption: how the intervals were made, and what the ``seeds`` of the rows it
    describes (their seed counts) make of them (:func:`seed_caveat`)."""
    return (f"{100 * level:g} % intervals: {METHOD} ({resamples} resamples of the per-seed tuples, generator seed "
            f"{seed}, percentile interval); {seed_caveat(seeds)}")


def seed_caveat(seeds: Sequence[int] | None = None) -> str:
    """What few seeds do to an interval, for the seed counts of the rows shown (a card of 2-seed rows
    says 2 seeds, never the usual 3). n seeds give C(2n - 1, n) distinct resamples and an interval no
    wider than the seeds' range; one seed gives none."""
    counts = sorted({int(n) for n in (seeds or []) if n == n and int(n) > 0})
    if not counts:
        return "with few seeds they are optimistic (n seeds give C(2n - 1, n) distinct resamples)"
    parts = []
    for n in counts:
        if n == 1:
            parts.append("1 seed gives no interval")
        elif n < 10:
            parts.append(f"{n} seeds give only {math.comb(2 * n - 1, n)} distinct resamples: read the interval as a "
                         "lower bound on the uncertainty")
        else:
            parts.append(f"{n} seeds give {math.comb(2 * n - 1, n)} distinct resamples")
    return "; ".join(parts)


@dataclass(frozen=True)
class Interval:
    """A statistic over seeds with its percentile-bootstrap interval (:func:`bootstrap_ci`); NaN bounds under 2 seeds."""
    estimate: float  # the statistic on the seeds as they are
    low: float  # NaN with fewer than 2 seeds
    high: float
    seeds: int
    level: float = LEVEL
    resamples: int = RESAMPLES
    method: str = METHOD

    def __str__(self) -> str:
        if math.isnan(self.low):
            return f"{self.estimate:.4g} (n={self.seeds}, no interval)"
        return f"{self.estimate:.4g} [{self.low:.4g}, {self.high:.4g}] (n={self.seeds})"


@dataclass(frozen=True)
class Comparison:
    """The difference of a statistic between two sets of seeds, its bootstrap interval, and whether that excludes 0."""
    difference: float  # statistic(a) - statistic(b)
    low: float
    high: float
    significant: bool  # the interval excludes 0
    paired: bool  # resampled by shared seed (else each side on its own)
    seeds: int  # shared seeds when paired, else the smaller side
    level: float = LEVEL
    resamples: int = RESAMPLES


def _tuples(values) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or len(arr) == 0:
        raise ValueError(f"expected one tuple of values per seed (a non-empty 1-D or 2-D array), got shape {arr.shape}")
    return arr


def _check(resamples: int, level: float) -> None:
    if not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be a positive integer, got {resamples!r}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")


def _draws(n: int, resamples: int, seed: int) -> np.ndarray:
    """Seed indices of each resample, shape (resamples, n)."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def _percentiles(values: np.ndarray, level: float, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    q = [100 * (1 - level) / 2, 100 * (1 + level) / 2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns give NaN
        low, high = np.nanpercentile(values, q, axis=axis)
    return low, high


def _resampled(arr: np.ndarray, statistic: Callable[[np.ndarray], float] | None, draws: np.ndarray) -> np.ndarray:
    """The statistic of every resample (``None``: the mean of the first column, vectorised). A
    statistic over seeds does not depend on their order, so each drawn multiset is computed once."""
    if statistic is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nanmean(arr[:, 0][draws], axis=1)
    cache: dict[tuple, float] = {}
    out = np.empty(len(draws))
    for r, idx in enumerate(draws):
        key = tuple(sorted(idx))
        if key not in cache:
            cache[key] = float(statistic(arr[list(key)]))
        out[r] = cache[key]
    return out


def _statistic(arr: np.ndarray, statistic: Callable[[np.ndarray], float] | None) -> float:
    if statistic is not None:
        return float(statistic(arr))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmean(arr[:, 0]))


def bootstrap_ci(values, statistic: Callable[[np.ndarray], float] | None = None, *, resamples: int = RESAMPLES,
                 level: float = LEVEL, seed: int = SEED) -> Interval:
    """Percentile bootstrap interval of ``statistic`` over seeds.

    ``values``: one tuple per seed (shape ``(seeds, k)``, or ``(seeds,)`` for one value each).
    ``statistic``: maps the resampled tuples (an array of the same shape) to a float, e.g.
    ``lambda t: metrics.lrs(*...)`` on mean accuracies, or the mean of per-seed scores recomputed from
    each tuple; default: the mean of the first column. Must not depend on the order of the seeds.
    """
    _check(resamples, level)
    arr = _tuples(values)
    estimate = _statistic(arr, statistic)
    if len(arr) < 2:
        return Interval(estimate, math.nan, math.nan, len(arr), level, resamples)
    low, high = _percentiles(_resampled(arr, statistic, _draws(len(arr), resamples, seed)), level)
    return Interval(estimate, float(low), float(high), len(arr), level, resamples)


def bootstrap_mean_intervals(values, *, resamples: int = RESAMPLES, level: float = LEVEL,
                             seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """Interval of the mean over seeds of every column of ``values`` (shape ``(seeds, columns)``;
    NaN = missing for that seed, left out of that resample's mean), with the draws of
    :func:`bootstrap_ci`. Returns (low, high), one entry per column; NaN with fewer than 2 seeds."""
    _check(resamples, level)
    arr = _tuples(values)
    if len(arr) < 2:
        nan = np.full(arr.shape[1], np.nan)
        return nan, nan.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        means = np.nanmean(arr[_draws(len(arr), resamples, seed)], axis=1)  # (resamples, columns)
    return _percentiles(means, level)


def paired_difference(a, b, statistic: Callable[[np.ndarray], float] | None = None, *,
                      seeds_a: Sequence[int] | None = None, seeds_b: Sequence[int] | None = None,
                      resamples: int = RESAMPLES, level: float = LEVEL, seed: int = SEED) -> Comparison:
    """Is ``statistic(a)`` different from ``statistic(b)``? The bootstrap interval of their difference.

    With ``seeds_a`` and ``seeds_b`` (the seed of each tuple) and at least 2 seeds in common, the
    comparison is *paired*: only the shared seeds are used and each resample draws the same seeds
    for both sides, so what a seed does to both (initialisation, batch order, the shared random
    baseline) cancels. Otherwise each side is resampled on its own (unpaired). ``significant``:
    the ``level`` interval excludes 0.
    """
    _check(resamples, level)
    a, b = _tuples(a), _tuples(b)
    paired = False
    if seeds_a is not None and seeds_b is not None:
        if len(seeds_a) != len(a) or len(seeds_b) != len(b):
            raise ValueError("seeds_a / seeds_b must name the seed of every tuple")
        common = sorted(set(seeds_a) & set(seeds_b))
        if len(common) >= 2:
            pos_a, pos_b = {s: i for i, s in enumerate(seeds_a)}, {s: i for i, s in enumerate(seeds_b)}
            a, b = a[[pos_a[s] for s in common]], b[[pos_b[s] for s in common]]
            paired = True
    difference = _statistic(a, statistic) - _statistic(b, statistic)
    if min(len(a), len(b)) < 2:
        return Comparison(difference, math.nan, math.nan, False, paired, min(len(a), len(b)), level, resamples)
    if paired:
        draws = _draws(len(a), resamples, seed)  # the same seeds for both sides
        if statistic is None:
            diffs = _resampled(a, None, draws) - _resampled(b, None, draws)
        else:
            k = a.shape[1]
            diffs = _resampled(np.concatenate([a, b], axis=1),
                               lambda t: statistic(t[:, :k]) - statistic(t[:, k:]), draws)
    else:
        rng = np.random.default_rng(seed)
        draws_a = rng.integers(0, len(a), size=(resamples, len(a)))
        draws_b = rng.integers(0, len(b), size=(resamples, len(b)))
        diffs = _resampled(a, statistic, draws_a) - _resampled(b, statistic, draws_b)
    low, high = (float(v) for v in _percentiles(diffs, level))
    significant = bool(not math.isnan(low) and (low > 0 or high < 0))
    return Comparison(difference, low, high, significant, paired, len(a) if paired else min(len(a), len(b)),
                      level, resamples)


def rank_groups(names: Sequence[str], estimates: Sequence[float], different: Callable[[int, int], bool],
                higher_is_better: bool = True) -> pd.DataFrame:
    """Ranks that only separate what is significantly different.

    ``different(i, j)``: whether rows i and j differ significantly (e.g. ``paired_difference(...)
    .significant``), asked once per pair (i < j). Rank of a row = 1 + the number of rows that are
    better *and* significantly different (as LMSYS's Chatbot Arena ranks), so three rows where the
    first two are tied read 1, 1, 3; ``tied_with`` lists the rows a row is not significantly
    different from. Returns a frame in the input order with columns ``name``, ``rank``,
    ``tied_with`` (a list).
    """
    if len(names) != len(estimates):
        raise ValueError("one estimate per name")
    sign = 1.0 if higher_is_better else -1.0
    n = len(names)
    diff = [[False] * n for _ in range(n)]
    for i in range(n):  # one test per pair: "i differs from j" is "j differs from i"
        for j in range(i + 1, n):
            diff[i][j] = diff[j][i] = bool(different(i, j))
    rows = []
    for i in range(n):
        better = sum(1 for j in range(n) if diff[i][j] and sign * estimates[j] > sign * estimates[i])
        tied = [names[j] for j in sorted(range(n), key=lambda j: -sign * estimates[j]) if j != i and not diff[i][j]]
        rows.append({"name": names[i], "rank": 1 + better, "tied_with": tied})
    return pd.DataFrame(rows)


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-b between two score lists over the same items (NaN with fewer than 2 items or a
    constant list): 1 = the same ranking, -1 = reversed."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) != len(y):
        raise ValueError("kendall_tau needs two lists over the same items")
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return math.nan
    return float(scipy.stats.kendalltau(x, y).statistic)


def rank_stability(scores: pd.DataFrame, reference: str | None = None) -> pd.DataFrame:
    """How stable is a ranking? ``scores``: one row per item (method), one column per setting (an
    architecture, a seed, a weight). Kendall's tau-b of every setting's ranking against the
    ``reference`` column (default: the mean over all settings), and the items both rank."""
    if scores.empty:
        return pd.DataFrame(columns=["setting", "reference", "tau", "items"])
    ref = scores.mean(axis=1) if reference is None else scores[reference]
    label = "mean over settings" if reference is None else str(reference)
    rows = []
    for column in scores.columns:
        if reference is not None and column == reference:
            continue
        keep = scores[column].notna() & ref.notna()
        rows.append({"setting": column, "reference": label, "tau": kendall_tau(scores[column][keep], ref[keep]),
                     "items": int(keep.sum())})
    return pd.DataFrame(rows)
