"""One result's values as a person reads them: per value its unit, mean, std, bootstrap interval
over seeds and each seed's value, in the units of :mod:`ddlib.specs.units`. ``ddlib score`` prints it,
``ddlib.score()``'s result and the notebooks show it (``result.values()``), and
``--format csv|json|markdown`` writes it: the same numbers everywhere.

By default only the scores are shown (``columns="scores"``: the protocol's headline board's score
and the columns it defines, e.g. LRS, HLR, IOR and the accuracies they come from); ``"all"`` adds
every other logged value (calibration, cost per role, learning rates).

>>> import pandas as pd
>>> per_seed = pd.DataFrame({"seed": [0, 1], "lrs": [18.42, 17.41], "acc_syn_hard": [57.33, 55.33]})
>>> value_table(per_seed, ["lrs"])[["value", "unit", "mean"]].to_dict("records")
[{'value': 'lrs', 'unit': '0-100', 'mean': 17.915}]
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from ddlib.scores import metrics

from ddlib.specs import units
__all__ = ["value_table", "format_table", "render", "FORMATS"]

FORMATS = ("table", "csv", "json", "markdown")


def value_table(per_seed: pd.DataFrame, names: Sequence[str] | None = None) -> pd.DataFrame:
    """Per value (``names``, in that order; None: every column but ``seed``) of a per-seed frame in
    shown units: ``value``, ``unit``, ``mean``, ``std`` (over seeds, ddof 0, as DC and DD-Ranking
    report), ``low`` and ``high`` (the bootstrap interval of the mean,
    :func:`ddlib.scores.stats.bootstrap_mean_intervals`; NaN with one seed) and ``seed <s>``."""
    from ddlib.scores import stats  # scipy: not at the command line's start

    columns = [c for c in per_seed.columns if c != "seed"] if names is None else [c for c in names if c in per_seed]
    seeds = [int(s) for s in per_seed["seed"]] if "seed" in per_seed else list(range(len(per_seed)))
    values = per_seed[columns].to_numpy(dtype=float) if columns else np.empty((len(per_seed), 0))
    low, high = stats.bootstrap_mean_intervals(values, resamples=stats.RESAMPLES, level=stats.LEVEL, seed=stats.SEED) \
        if columns else ([], [])
    rows = []
    for i, name in enumerate(columns):
        column = values[:, i]
        mean, std = metrics.mean_std(column[~np.isnan(column)])  # population std, as every board shows
        rows.append({"value": name, "unit": units.unit_of(name).name, "mean": mean, "std": std,
                     "low": float(low[i]), "high": float(high[i]),
                     **{f"seed {s}": float(v) for s, v in zip(seeds, column)}})
    return pd.DataFrame(rows, columns=["value", "unit", "mean", "std", "low", "high", *(f"seed {s}" for s in seeds)])


def format_table(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`value_table`'s numbers as text, each in its unit's format: ``mean ± std`` and the interval."""
    from ddlib.scores import stats
    out = []
    for row in table.to_dict("records"):
        unit = units.unit_of(row["value"])
        interval = "" if np.isnan(row["low"]) else f"[{unit.format(row['low'])}, {unit.format(row['high'])}]"
        shown = {"value": units.display_name(row["value"]), "unit": row["unit"],
                 "mean ± std": unit.format(row["mean"]) + ("" if np.isnan(row["std"]) else f" ± {unit.format(row['std'])}"),
                 f"{100 * stats.LEVEL:g} % interval": interval}
        shown.update({k: unit.format(v) for k, v in row.items() if k.startswith("seed ")})
        out.append(shown)
    return pd.DataFrame(out)


def render(table: pd.DataFrame, fmt: str = "table") -> str:
    """A :func:`value_table` as ``table`` (aligned text), ``markdown`` (both formatted in the units'
    formats), ``csv`` or ``json`` (the numbers, in shown units, for other programs)."""
    if fmt == "csv":
        return table.to_csv(index=False)
    if fmt == "json":
        return table.to_json(orient="records", indent=1)
    shown = format_table(table)
    if fmt == "table" and len(shown):  # names read left-aligned
        shown["value"] = shown["value"].str.ljust(shown["value"].str.len().max())
    if fmt == "markdown":
        header = "| " + " | ".join(shown.columns) + " |\n|" + "---|" * len(shown.columns) + "\n"
        return header + "".join("| " + " | ".join(str(v) for v in row) + " |\n" for row in shown.itertuples(index=False))
    if fmt != "table":
        raise ValueError(f"format {fmt!r}: one of {list(FORMATS)}")
    return shown.to_string(index=False)
