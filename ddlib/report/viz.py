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


# --------------------------------------------------------------------------- report card and site plots


def radar(profiles: dict[str, dict[str, tuple[float, str]]], title: str = ""):
    """One polygon per method over the same axes. ``profiles[method][axis] = (value in [0, 1], label)``:
    each score normalised to [0, 1] (the label says the raw value and how it was scaled); a NaN
    value (the protocol has not run) sits at 0 and its label says "not run"."""
    import numpy as np

    if not profiles:
        return None
    axes = list(dict.fromkeys(a for p in profiles.values() for a in p))
    if len(axes) < 3:
        return None
    angles = np.linspace(0, 2 * np.pi, len(axes), endpoint=False).tolist()
    fig, ax = plt.subplots(figsize=(6, 5.2), subplot_kw={"polar": True})
    for method, profile in profiles.items():
        values = [profile.get(a, (float("nan"), ""))[0] for a in axes]
        shown = [0.0 if v != v else min(max(v, 0.0), 1.0) for v in values]  # NaN -> centre
        ax.plot(angles + angles[:1], shown + shown[:1], marker="o", label=method)
        ax.fill(angles + angles[:1], shown + shown[:1], alpha=0.12)
    name, first = next(iter(profiles.items()))  # the axes say the first profile's raw values
    who = f"{name}: " if len(profiles) > 1 else ""
    labels = [f"{a}\n{who}{first.get(a, (0, 'not run'))[1]}" for a in axes]
    ax.set_xticks(angles, labels, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_yticks([0.25, 0.5, 0.75, 1.0], ["0.25", "0.5", "0.75", "1"], fontsize=7)
    ax.set_title(title or "Scores, normalised to [0, 1]", fontsize=10)
    if len(profiles) > 1:
        ax.legend(fontsize="small", loc="upper right", bbox_to_anchor=(1.35, 1.1))
    fig.tight_layout()
    return fig


def accuracy_vs_ipc(points: pd.DataFrame, highlight: str | None = None, full: tuple[float, float, float] | None = None,
                    title: str = ""):
    """Accuracy (%) against images per class: one line per method (``points``: method, ipc, mean,
    low, high as fractions; the interval as error bars), random and K-Center dashed, the full
    training set as a horizontal line with its interval shaded (``full`` = mean, low, high)."""
    if points.empty:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for method, rows in points.groupby("method", sort=False):
        rows = rows.sort_values("ipc")
        err = [100 * (rows["mean"] - rows["low"]).fillna(0), 100 * (rows["high"] - rows["mean"]).fillna(0)]
        style = {"linestyle": "--"} if method in ("random", "kcenter") else {}
        if str(method).startswith("random subset"):  # the random baseline of the label-robust cells
            style = {"linestyle": "--", "color": "gray"}
        if highlight is not None:
            style["linewidth"] = 2.5 if method == highlight else 1.2
        ax.errorbar(rows["ipc"], 100 * rows["mean"], yerr=err, marker="o", capsize=3, label=str(method), **style)
    if full is not None and full[0] == full[0]:
        ax.axhline(100 * full[0], color="black", linestyle=":", label="full training set")
        if full[1] == full[1]:
            ax.axhspan(100 * full[1], 100 * full[2], color="black", alpha=0.08)
    if points["ipc"].nunique() > 1:
        ax.set_xscale("log")
    ax.set_xticks(sorted(points["ipc"].unique()), [str(i) for i in sorted(points["ipc"].unique())])
    return _labelled(fig, ax, "images per class", "test accuracy (%)",
                     title or "Accuracy against images per class (95 % intervals)")


def loss_curves(curves: dict[str, list[list[float]]], title: str = ""):
    """Training loss per epoch: per label, the mean over its runs (seeds) as a line and the range
    as a band."""
    import numpy as np

    curves = {k: [c for c in v if c] for k, v in curves.items()}
    curves = {k: v for k, v in curves.items() if v}
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label, runs in curves.items():
        length = min(len(c) for c in runs)
        arr = np.array([c[:length] for c in runs])
        epochs = np.arange(1, length + 1)
        line, = ax.plot(epochs, arr.mean(0), label=f"{label} ({len(runs)} seed{'s' if len(runs) > 1 else ''})")
        if len(runs) > 1:
            ax.fill_between(epochs, arr.min(0), arr.max(0), color=line.get_color(), alpha=0.15)
    low = min(min(min(c) for c in runs) for runs in curves.values())
    high = max(max(max(c) for c in runs) for runs in curves.values())
    if low > 0 and high / low > 20:  # spans orders of magnitude
        ax.set_yscale("log")
    return _labelled(fig, ax, "epoch", "training loss", title or "Training loss (mean over seeds, band: min to max)")


def _labelled(fig, ax, xlabel: str, ylabel: str, title: str):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def confusion(matrix, classes, title: str = ""):
    """A confusion matrix, each true class's row normalised to 1 (counts in the title's models)."""
    import numpy as np

    counts = np.asarray(matrix, dtype=float)
    if counts.size == 0:
        return None
    rates = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    n = len(classes)
    fig, ax = plt.subplots(figsize=(min(9, 1.2 + 0.45 * n), min(8, 1 + 0.42 * n)))
    image = ax.imshow(rates, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(n), [str(c) for c in classes], rotation=45 if n > 10 else 0, fontsize=7)
    ax.set_yticks(range(n), [str(c) for c in classes], fontsize=7)
    if n <= 12:
        for i in range(n):
            for j in range(n):
                ax.text(j, i, f"{rates[i, j]:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if rates[i, j] > 0.5 else "black")
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(title or "Confusion matrix (rows: true class, normalised)", fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    return fig


def confusion_grid(matrices: dict[str, tuple], title: str = ""):
    """Several confusion matrices side by side (``label -> (counts, classes)``), rows normalised."""
    import numpy as np

    if not matrices:
        return None
    n = len(matrices)
    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.4 * rows + 0.4), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_axis_off()
    for ax, (label, (matrix, classes)) in zip(axes.flat, matrices.items()):
        counts = np.asarray(matrix, dtype=float)
        ax.imshow(counts / np.maximum(counts.sum(1, keepdims=True), 1), cmap="Blues", vmin=0, vmax=1)
        ticks = range(len(classes))
        ax.set_xticks(ticks, [str(c) for c in classes], fontsize=6)
        ax.set_yticks(ticks, [str(c) for c in classes], fontsize=6)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("predicted", fontsize=7)
        ax.set_ylabel("true", fontsize=7)
    fig.suptitle(title or "Confusion matrices (rows: true class, normalised)", fontsize=10)
    fig.tight_layout()
    return fig


def set_grid(tiles, names, title: str = "", max_classes: int = 100, max_rows: int = 20):
    """A set's images labelled with their class names (``tiles``: classes x images x H x W x C in
    [0, 1]; ``names``: one per class), sized to fit a screen. One image per class: the classes side by
    side, ten to a line, each named under its image. More: one line per class (at most ``max_rows``
    classes, the title says how many are shown), the name at its left."""
    import numpy as np

    tiles = np.asarray(tiles, dtype=float)
    classes, per_class, h, w, channels = tiles.shape
    names = [str(n) for n in names][:classes] + [str(i) for i in range(len(names), classes)]
    pad = max(1, h // 16)
    shown = min(classes, max_classes if per_class == 1 else max_rows)
    more = f" (first {shown} of {classes} classes)" if shown < classes else ""
    if per_class == 1:
        cols = min(shown, 10)
        lines = -(-shown // cols)
        label = int(h * 0.45) + pad  # a strip under each image for its name
        canvas = np.ones((lines * (h + label + pad) + pad, cols * (w + pad) + pad, channels))
        spots = []
        for k in range(shown):
            y, x = pad + (k // cols) * (h + label + pad), pad + (k % cols) * (w + pad)
            canvas[y:y + h, x:x + w] = tiles[k, 0]
            spots.append((x + w / 2, y + h + label / 2, names[k]))
        inch = 0.95 if cols > 1 else 1.4  # per image
        fig, ax = plt.subplots(figsize=(cols * inch, lines * inch * (h + label + pad) / (w + pad) + 0.35))
        for x, y, name in spots:
            ax.text(x, y, name, ha="center", va="center", fontsize=8)
    else:
        canvas = np.ones((shown * (h + pad) + pad, per_class * (w + pad) + pad, channels))
        for k in range(shown):
            for j in range(per_class):
                y, x = pad + k * (h + pad), pad + j * (w + pad)
                canvas[y:y + h, x:x + w] = tiles[k, j]
        inch = min(0.7, 7.0 / shown, 10.0 / per_class)  # per image: the grid stays within about 7 x 10 inches
        fig, ax = plt.subplots(figsize=(per_class * inch + 1.3, shown * inch + 0.35))
        ax.set_yticks([pad + k * (h + pad) + h / 2 for k in range(shown)], names[:shown], fontsize=8)
        ax.set_xticks([])
        for side in ax.spines.values():
            side.set_visible(False)
    image = canvas[..., 0] if channels == 1 else canvas
    ax.imshow(image, cmap="gray" if channels == 1 else None, vmin=0, vmax=1, interpolation="nearest")
    if per_class == 1:
        ax.set_axis_off()
    ax.set_title((title or "The set's images") + more, fontsize=9)
    fig.tight_layout()
    return fig
