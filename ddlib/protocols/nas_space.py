"""DC-Bench's NAS protocol, the pure parts: NAS-Bench-201 ground truth, sampling, rank correlation.

DC-Bench (Cui et al., NeurIPS 2022 D&B) trains sampled NAS-Bench-201 cells (``ddlib.models``'
``nasbench201``) on a distilled set and asks how well the accuracies they reach rank the cells by
their ground-truth accuracy (NAS-Bench-201: test accuracy after 200 epochs on the full data):

    table = load_ground_truth("nasbench201-accuracy.csv", dataset="cifar10")
    sample = sample_architectures(table, k=100, seed=0)
    proxy = [train_on_distilled(arch) for arch in sample.arch]      # the protocol's part
    rank_correlation(proxy, sample.accuracy)  # {'spearman', 'kendall', 'top1', 'best_possible', 'n', ...}

Everything here is a pure function of its arguments (numpy, pandas, scipy only).
"""

from __future__ import annotations

import math
import warnings
from typing import Sequence

import numpy as np
import pandas as pd
import scipy.stats

from ddlib.models.nasbench201 import format_arch, parse_arch

__all__ = ["NasError", "DATASET_COLUMNS", "SAMPLINGS", "load_ground_truth", "sample_architectures", "sample_ground_truth",
           "rank_correlation"]


class NasError(ValueError):
    """A ground-truth table could not be used; the message names the file (and row)."""


# Column names of NAS-Bench-201 accuracy CSVs (the layout of ../shared/data/nasbench201-accuracy.csv).
DATASET_COLUMNS = {
    "cifar10": "CIFAR10TestAccuracy200Epochs",
    "cifar100": "CIFAR100TestAccuracy200Epochs",
    "imagenet16-120": "ImageNetTestAccuracy200Epochs",
}
ARCH_COLUMNS = ("ArchitectureString", "arch")
UNIQUE_COLUMNS = ("UniqueString", "unique")


def _first_present(columns, names):
    return next((name for name in names if name in columns), None)


def load_ground_truth(path, column: str | None = None, dataset: str | None = None) -> pd.DataFrame:
    """Read a NAS-Bench-201 ground-truth CSV into a DataFrame with columns ``arch`` (canonical
    architecture string), ``accuracy`` (percent, float) and, when the file has one, ``unique``
    (the isomorphism class, NAS-Bench-201's ``UniqueString``). Rows keep the file's order.

    The architecture column is ``ArchitectureString`` (or ``arch``); the accuracy column is
    ``column`` when given, else the one for ``dataset`` (``cifar10`` -> ``CIFAR10TestAccuracy200Epochs``,
    ``cifar100`` -> ``CIFAR100TestAccuracy200Epochs``, ``imagenet16-120`` ->
    ``ImageNetTestAccuracy200Epochs``: see :data:`DATASET_COLUMNS`), else
    ``CIFAR10TestAccuracy200Epochs``, else a column named ``accuracy``.

    Raises :class:`NasError` naming the file for: a file that cannot be read or parsed as CSV, no
    rows, a missing column, an architecture string :func:`parse_arch` refuses, a missing or
    non-numeric accuracy, one outside [0, 100], accuracies that all look like fractions (every value
    <= 1 in a table of two or more rows: percent is expected), a missing isomorphism class, and a
    duplicate architecture (after canonicalising the string); the row is named as ``row i`` (1-based
    data row) and ``line i + 1`` of the file.
    """
    where = str(path)
    if dataset is not None and column is None:
        key = str(dataset).lower()
        if key not in DATASET_COLUMNS:
            raise NasError(f"{where}: unknown dataset {dataset!r}; known: {', '.join(DATASET_COLUMNS)}")
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except FileNotFoundError:
        raise NasError(f"{where}: ground-truth file not found") from None
    except pd.errors.EmptyDataError:
        raise NasError(f"{where}: the file is empty (expected a CSV with a header row)") from None
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, ValueError) as error:
        raise NasError(f"{where}: cannot read as CSV: {error}") from None
    raw.columns = [str(c).strip() for c in raw.columns]
    columns = list(raw.columns)

    arch_col = _first_present(columns, ARCH_COLUMNS)
    if arch_col is None:
        raise NasError(f"{where}: no architecture column ({' or '.join(ARCH_COLUMNS)}); columns: {columns}")
    if column is not None:
        acc_col = column
    elif dataset is not None:
        key = str(dataset).lower()
        acc_col = DATASET_COLUMNS[key]
    else:
        acc_col = _first_present(columns, (DATASET_COLUMNS["cifar10"], "accuracy")) or DATASET_COLUMNS["cifar10"]
    if acc_col not in columns:
        raise NasError(f"{where}: no accuracy column {acc_col!r}; columns: {columns}")
    unique_col = _first_present(columns, UNIQUE_COLUMNS)
    if raw.empty:
        raise NasError(f"{where}: no rows")

    def row(i: int) -> str:
        return f"row {i + 1} (line {i + 2})"

    archs = []
    for i, text in enumerate(raw[arch_col]):
        try:
            archs.append(format_arch(parse_arch(text.strip())))
        except ValueError as error:
            raise NasError(f"{where}: {row(i)}, column {arch_col}: {error}") from None

    accuracy = pd.to_numeric(raw[acc_col].str.strip(), errors="coerce").to_numpy(dtype=float)
    for i, value in enumerate(accuracy):
        if not math.isfinite(value):
            raise NasError(f"{where}: {row(i)}, column {acc_col}: accuracy {raw[acc_col].iloc[i]!r} is not a number")
        if not 0.0 <= value <= 100.0:
            raise NasError(f"{where}: {row(i)}, column {acc_col}: accuracy {value} is outside [0, 100] (percent)")
    if len(accuracy) >= 2 and accuracy.max() <= 1.0:
        raise NasError(f"{where}: column {acc_col}: every accuracy is <= 1, which looks like fractions; "
                       f"accuracies must be in percent")

    seen: dict[str, int] = {}
    for i, arch in enumerate(archs):
        if arch in seen:
            raise NasError(f"{where}: {row(i)}: duplicate architecture {arch} (first at {row(seen[arch])})")
        seen[arch] = i

    table = pd.DataFrame({"arch": archs, "accuracy": accuracy})
    if unique_col is not None:
        unique = raw[unique_col].str.strip()
        for i, value in enumerate(unique):
            if not value:
                raise NasError(f"{where}: {row(i)}, column {unique_col}: missing isomorphism class")
        table["unique"] = unique.to_numpy()
    table.attrs.update(source=where, column=acc_col)
    return table


SAMPLINGS = ("uniform", "isomorphism")


def sample_architectures(table: pd.DataFrame, k: int, seed: int, sampling: str = "uniform") -> pd.DataFrame:
    """Draw ``k`` distinct architectures from a :func:`load_ground_truth` table.

    ``sampling="uniform"`` (the default, DC-Bench's): ``k`` distinct rows, uniformly, i.e. uniform
    over the 15,625 cell strings of a full NAS-Bench-201 table. DC-Bench draws each of the six
    edges' ops uniformly (``torch.randint(0, 5, (6,))`` per network), which is the same
    distribution, but with replacement: 100 draws repeat an architecture with probability ~27 %;
    here the ``k`` are distinct.

    ``sampling="isomorphism"``: uniform over isomorphism classes (the table's ``unique`` column,
    required). The 15,625 strings fall into 6,466 classes; two strings of one class compute the
    same function (e.g. an edge into a node whose output is never used), so their ground-truth
    accuracies differ only by training noise, and sampling both counts one network twice in the
    rank correlation. ``k`` distinct classes are chosen, then one member of each, both uniformly.

    Deterministic: a private ``numpy.random.default_rng(seed)`` (the global NumPy / PyTorch RNGs are
    neither read nor advanced), applied to the table sorted by ``arch``, so the same seed gives the
    same sample whatever the table's row order. Returns the drawn rows in draw order, index reset.
    Raises ``ValueError`` when ``k`` exceeds the number of rows (or classes).
    """
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling must be one of {list(SAMPLINGS)}, got {sampling!r}")
    if "arch" not in table.columns:
        raise ValueError(f"table needs an 'arch' column (see load_ground_truth); columns: {list(table.columns)}")
    rng = np.random.default_rng(seed)
    ordered = table.sort_values("arch", kind="stable").reset_index(drop=True)
    if sampling == "isomorphism":
        if "unique" not in ordered.columns:
            raise ValueError("sampling 'isomorphism' needs the isomorphism class of every architecture "
                             "(a UniqueString column in the ground-truth CSV)")
        groups = ordered.groupby("unique", sort=True).indices  # class -> row positions (sorted by arch)
        classes = sorted(groups)
        if k > len(classes):
            raise ValueError(f"cannot draw {k} architectures from {len(classes)} isomorphism classes "
                             f"(sampling 'uniform' allows isomorphic ones)")
        chosen = rng.permutation(len(classes))[:k]
        rows = [groups[classes[c]][rng.integers(len(groups[classes[c]]))] for c in chosen]
    else:
        if k > len(ordered):
            raise ValueError(f"cannot draw {k} distinct architectures from a table of {len(ordered)}")
        rows = rng.permutation(len(ordered))[:k]
    return ordered.iloc[list(rows)].reset_index(drop=True)


def sample_ground_truth(path, k: int, seed: int, column: str | None = None, dataset: str | None = None,
                        sampling: str = "uniform") -> pd.DataFrame:
    """:func:`load_ground_truth` then :func:`sample_architectures`; every error names the file."""
    table = load_ground_truth(path, column=column, dataset=dataset)
    try:
        return sample_architectures(table, k, seed, sampling=sampling)
    except ValueError as error:
        raise NasError(f"{path}: {error} (num_archs: {k})") from None


def rank_correlation(proxy_scores: Sequence[float], true_scores: Sequence[float]) -> dict:
    """How well ``proxy_scores`` (e.g. accuracies after training on a distilled set) rank the same
    architectures as ``true_scores`` (ground truth), position by position.

    Returns a dict:

    - ``spearman``: Spearman's rho (``scipy.stats.spearmanr``), ``kendall``: Kendall's tau-b
      (``scipy.stats.kendalltau``; ties handled by tau-b). Either is NaN when one input is constant
      (a correlation is undefined there); scipy's ``ConstantInputWarning`` is silenced.
    - ``top1``: the ground truth of the architecture the proxy ranks first. Ties in the proxy are
      broken deterministically by position: the first of the tied maxima in input order wins
      (``numpy.argmax``); ``top1_index`` is that position.
    - ``best_possible``: the highest ground truth in the sample (``top1`` of a perfect proxy).
    - ``n``: the number of architectures.

    Needs at least 2 architectures, equal lengths and finite values; otherwise ``ValueError``.
    """
    proxy = np.asarray(proxy_scores, dtype=float).ravel()
    truth = np.asarray(true_scores, dtype=float).ravel()
    if proxy.shape != truth.shape:
        raise ValueError(f"{proxy.size} proxy scores but {truth.size} true scores")
    if proxy.size < 2:
        raise ValueError(f"rank correlation needs at least 2 architectures, got {proxy.size}")
    for name, values in (("proxy", proxy), ("true", truth)):
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise ValueError(f"{name} scores must be finite; position {int(bad[0])} is {values[bad[0]]}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", scipy.stats.ConstantInputWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        spearman = float(scipy.stats.spearmanr(proxy, truth).statistic)
        kendall = float(scipy.stats.kendalltau(proxy, truth).statistic)
    first = int(np.argmax(proxy))
    return {
        "spearman": spearman,
        "kendall": kendall,
        "top1": float(truth[first]),
        "top1_index": first,
        "best_possible": float(truth.max()),
        "n": int(proxy.size),
    }
