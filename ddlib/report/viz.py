"""Plots for notebooks and summaries (matplotlib, headless-safe)."""

from __future__ import annotations

import matplotlib

if matplotlib.get_backend().lower() not in ("module://matplotlib_inline.backend_inline", "inline"):
    matplotlib.use("Agg")  # scripts and CI have no display; notebooks keep their inline backend
import matplotlib.pyplot as plt
import pandas as pd

from ddlib.data.distilled import DistilledSet, grid_tensor


def show_set(distilled: DistilledSet, title: str = "", max_per_class: int = 10):
    """Show a set as one row per class."""
    grid = grid_tensor(distilled, max_per_class).permute(1, 2, 0).numpy()
    rows = distilled.num_classes
    fig, ax = plt.subplots(figsize=(min(12, 1.2 * min(max_per_class, distilled.ipc) + 1), min(12, 0.6 * rows + 1)))
    ax.imshow(grid.squeeze(-1) if grid.shape[-1] == 1 else grid, cmap="gray" if grid.shape[-1] == 1 else None)
    ax.set_axis_off()
    ax.set_title(title or f"{distilled.method}, IPC {distilled.ipc}")
    fig.tight_layout()
    return fig


def bar_with_errors(df: pd.DataFrame, group: str, series: str, value: str, error: str, title: str, ylabel: str):
    """Grouped bars (one group per ``group`` value, one bar per ``series``) with std error bars."""
    groups = list(dict.fromkeys(df[group]))
    names = list(dict.fromkeys(df[series]))
    width = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(groups) * max(1, len(names)) * 0.5 + 2), 4))
    for j, name in enumerate(names):
        sub = df[df[series] == name].set_index(group)
        xs = [i + (j - (len(names) - 1) / 2) * width for i, g in enumerate(groups) if g in sub.index]
        ys = [sub.loc[g, value] for g in groups if g in sub.index]
        es = [sub.loc[g, error] for g in groups if g in sub.index]
        ax.bar(xs, ys, width=width, yerr=es, capsize=3, label=str(name))
    ax.set_xticks(range(len(groups)), [str(g) for g in groups])
    ax.set_xlabel(group)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def accuracy_bars(table: pd.DataFrame, title: str, xlabel: str = ""):
    """Bars of a cell's accuracies (a table with ``mean %`` and ``std %`` columns, one row per label)."""
    fig, ax = plt.subplots(figsize=(max(4, 0.9 * len(table) + 2), 3.5))
    ax.bar(range(len(table)), table["mean %"], yerr=table["std %"], capsize=3, color="tab:blue")
    ax.set_xticks(range(len(table)), [str(i) for i in table.index], rotation=30, ha="right")
    ax.set_ylabel("test accuracy (%)")
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def proxy_scatter(table: pd.DataFrame, proxy: str, truth: str = "ground_truth", title: str = ""):
    """Ground-truth accuracy against the proxy's (one point per architecture): a good proxy is a rising cloud."""
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.scatter(table[proxy], table[truth], s=14)
    ax.set_xlabel("accuracy trained on the set (%)")
    ax.set_ylabel("ground-truth accuracy (%)")
    ax.set_title(title)
    fig.tight_layout()
    return fig
