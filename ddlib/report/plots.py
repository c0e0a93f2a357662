"""The plots of the summary, the report cards and the site, from the leaderboards (and, for loss
curves and confusion matrices, the evaluations under the cells: :mod:`ddlib.report.evals`)."""

from __future__ import annotations

import io
import json

import pandas as pd

from ddlib.protocols.common import FULL_IPC
from ddlib.protocols.dcbench_boards import SELECTION
from ddlib.report import evals, viz
from ddlib.report.boards import Boards

__all__ = ["SELECTION", "board_rows", "radar_profile", "radar_families", "ipc_points", "summary_figures", "set_grid_png",
           "RANDOM_BASELINE"]


def board_rows(board: pd.DataFrame, method: str, dataset: str, ipc: int | None) -> pd.DataFrame:
    """The rows of one set (method, dataset and, unless None, IPC) in a leaderboard."""
    if board.empty or "method" not in board:
        return pd.DataFrame()
    keep = (board["method"].astype(str) == method) & (board["dataset"].astype(str) == dataset)
    if ipc is not None and "ipc" in board:
        keep &= board["ipc"] == ipc
    return board[keep]


# The boards the radar reads, each with the mode whose rows it prefers (BEARD: untargeted attacks).
RADAR_BOARDS = (("lrs", None), ("ars", None), ("beard", "untargeted"), ("transfer", None), ("nas", None))
# the value each radar board is drawn by (every axis: higher is better)
RADAR_SCORES = {"lrs": "lrs", "ars": "ars", "beard": "crei", "transfer": "acc_transfer", "nas": "spearman"}


def _best(rows: pd.DataFrame, column: str) -> pd.DataFrame:
    """The rows that have ``column``, best first (a board's own order need not be by it: BEARD's sorts
    by family before CREI), so that "best of N variants" is the best."""
    if f"{column}_mean" not in rows:
        return rows.iloc[0:0]
    rows = rows[rows[f"{column}_mean"].notna()]
    return rows.sort_values(f"{column}_mean", ascending=False, kind="stable")


def _radar_rows(boards: Boards, name: str, method: str, dataset: str, ipc: int, prefer=None, precision=None,
                family=None) -> pd.DataFrame:
    """A set's rows on one board: of ``family`` (where given) and ``precision`` (where given), BEARD's
    preferred mode where it has rows in it; several rows are several variants (recipes, presets, models)."""
    rows = board_rows(boards[name], method, dataset, ipc)
    if prefer is not None and not rows.empty and "mode" in rows:
        preferred = rows[rows["mode"] == prefer]
        rows = preferred if not preferred.empty else rows
    for column, wanted in (("precision", precision), ("family", family)):
        if wanted is not None and not rows.empty and column in rows:
            rows = rows[rows[column].astype(str) == str(wanted)]
    return rows


def radar_families(boards: Boards, method: str, dataset: str, ipc: int, precision: str | None = None) -> dict[str, str]:
    """The family (the setting: data, model, recipe, precision) of the row each board shows for this set:
    pass it to :func:`radar_profile` to draw another method (random) from the same setting."""
    out = {}
    for name, prefer in RADAR_BOARDS:
        rows = _radar_rows(boards, name, method, dataset, ipc, prefer, precision)
        best = _best(rows, RADAR_SCORES[name])
        rows = best if not best.empty or name != "transfer" else _best(rows, "acc_others_avg")  # no DC-Bench four
        if not rows.empty and "family" in rows:
            out[name] = str(rows["family"].iloc[0])
    return out


def radar_profile(boards: Boards, method: str, dataset: str, ipc: int, precision: str | None = None,
                  families: dict[str, str] | None = None) -> dict[str, tuple[float, str]]:
    """LRS, ARS, CREI, DC-Bench's transfer average and NAS Spearman rho of a set (each the score its
    protocol's board ranks by), scaled to [0, 1] (LRS, ARS, CREI / 100; transfer average accuracy as a
    fraction; (rho + 1) / 2), NaN if not run.

    Which row: ``precision`` and ``families`` (board -> family, :func:`radar_families`) keep the rows of
    that precision and setting. Where the set still has several rows on a board (variants: two
    recipes, presets, models, precisions), the best is drawn and the value is
    labelled "best of N variants", never shown as if it were the only one.

    The transfer axis is DC-Bench's "Transfer" (``acc_transfer``: MLP, ResNet-18, ResNet-152, ViT)
    under :data:`TRANSFER_AXIS`. A transfer grid without those four has no such number; its mean over
    the grid's other architectures (``acc_others_avg``) is shown on an axis of its own,
    :data:`OTHERS_AXIS`, never under DC-Bench's name (two sets scored differently then sit on two
    axes instead of one)."""
    families = families or {}

    def value(name, column, prefer=None):
        rows = _best(_radar_rows(boards, name, method, dataset, ipc, prefer, precision, families.get(name)), column)
        if rows.empty:
            return float("nan"), ""
        return float(rows[f"{column}_mean"].iloc[0]), f" (best of {len(rows)} variants)" if len(rows) > 1 else ""

    (lrs, lrs_n), (ars, ars_n) = value("lrs", "lrs"), value("ars", "ars")
    (crei, crei_n), (rho, rho_n) = value("beard", "crei", "untargeted"), value("nas", "spearman")
    transfer, transfer_n = value("transfer", "acc_transfer")  # DC-Bench's Transfer: MLP, ResNet-18, ResNet-152, ViT
    others, others_n = value("transfer", "acc_others_avg") if transfer != transfer else (float("nan"), "")

    def label(value, text):
        return "not run" if value != value else text

    if others == others:  # a grid without DC-Bench's four: its own axis, its own name
        axis, shown, text = OTHERS_AXIS, others, f"{100 * others:.1f} % (not DC-Bench's four){others_n}"
    else:
        axis, shown, text = TRANSFER_AXIS, transfer, f"{100 * transfer:.1f} %{transfer_n}"
    return {"LRS": (lrs / 100, label(lrs, f"{lrs:.1f} / 100{lrs_n}")),
            "ARS": (ars / 100, label(ars, f"{ars:.1f} / 100{ars_n}")),
            "CREI": (crei / 100, label(crei, f"{crei:.1f} / 100{crei_n}")),
            axis: (shown, label(shown, text)),
            "NAS rho": ((rho + 1) / 2, label(rho, f"rho {rho:.2f} -> {(rho + 1) / 2:.2f}{rho_n}"))}


TRANSFER_AXIS = "DC-Bench Transfer"  # acc_transfer: the mean over MLP, ResNet-18, ResNet-152, ViT
OTHERS_AXIS = "other-arch mean"  # acc_others_avg: the mean over the grid's other architectures


def ipc_points(boards: Boards, dataset: str, methods: list[str]) -> tuple[pd.DataFrame, tuple | None, str]:
    """Accuracy against IPC of ``methods`` (+ random, K-Center): DC-Bench's compression table where it
    has them, else the hard-label accuracies of the Label-Robust table; the full-data line of the same."""
    for name, acc, full, what in (("compression", "acc_set", "acc_full", "DC-Bench compression cells"),
                                  ("lrs", "acc_syn_hard", "acc_real_hard", "label-robust cells, hard labels")):
        board = boards[name]
        if board.empty:
            continue
        rows = board[(board["dataset"].astype(str) == dataset) & board["method"].isin([*methods, *SELECTION])
                     & (board["ipc"] != FULL_IPC)]
        if rows.empty or not set(methods) & set(rows["method"]):
            continue
        if "model" in rows and rows["model"].nunique() > 1:  # one architecture per plot: the set's own
            rows = rows[rows["model"] == rows[rows["method"].isin(methods)]["model"].iloc[0]]
        points = pd.DataFrame({"method": rows["method"], "ipc": rows["ipc"], "mean": rows[f"{acc}_mean"],
                               "low": rows[f"{acc}_low"], "high": rows[f"{acc}_high"]})
        points = points.groupby(["method", "ipc"], as_index=False, sort=False).first()
        if "random" not in set(points["method"]):  # no random method plotted: the label-robust cells' baselines
            model = rows["model"].iloc[0] if "model" in rows and rows["model"].nunique() == 1 else None
            points = pd.concat([points, _random_baseline(boards, dataset, methods, model, set(points["ipc"]))],
                               ignore_index=True)
        reference = None
        if f"{full}_mean" in rows and rows[f"{full}_mean"].notna().any():
            best = rows.dropna(subset=[f"{full}_mean"]).iloc[0]
            reference = (best[f"{full}_mean"], best[f"{full}_low"], best[f"{full}_high"])
        return points, reference, what
    return pd.DataFrame(), None, ""


RANDOM_BASELINE = "random subset (baseline)"  # the label-robust cells' random subsets of the IPC, hard labels


def _hard_label(preset) -> bool:
    """Whether a label-robust row's random side is trained on hard labels (no preset, or a hard-label
    preset): there ``acc_rdm_any`` is the random subset's hard-label accuracy (the cell trains it once)."""
    if preset is None or (isinstance(preset, float) and preset != preset) or str(preset) in ("", "None"):
        return True
    try:
        from ddlib.protocols.presets import load_preset

        return load_preset(str(preset)).label_type == "hard"
    except Exception:  # noqa: BLE001 - a preset file moved since: not known to be hard-label
        return False


def _random_baseline(boards: Boards, dataset: str, methods: list[str], model, ipcs: set) -> pd.DataFrame:
    """Per IPC, the accuracy of the random subsets of that size the label-robust cells trained beside
    the set, on hard labels (``acc_rdm_any`` of a row without a soft-label preset; mean and interval
    over seeds), from the row of one of ``methods`` where there is one (its recipe), else of any method
    at that IPC."""
    board = boards["lrs"]
    if board.empty or "acc_rdm_any_mean" not in board:
        return pd.DataFrame()
    rows = board[(board["dataset"].astype(str) == dataset) & board["ipc"].isin(ipcs)
                 & board["acc_rdm_any_mean"].notna()]
    if model is not None and "model" in rows:
        rows = rows[rows["model"] == model]
    if "preset" in rows:
        rows = rows[[_hard_label(p) for p in rows["preset"]]]
    if rows.empty:
        return pd.DataFrame()
    rows = rows.assign(_own=~rows["method"].isin(methods)).sort_values("_own", kind="stable")
    rows = rows.groupby("ipc", as_index=False, sort=True).first()
    return pd.DataFrame({"method": RANDOM_BASELINE, "ipc": rows["ipc"], "mean": rows["acc_rdm_any_mean"],
                         "low": rows["acc_rdm_any_low"], "high": rows["acc_rdm_any_high"]})


def summary_figures(boards: Boards) -> dict:
    """Per dataset x IPC of the Label-Robust table: every method's radar, the training-loss curves of
    the models trained on each set and their confusion matrices; per dataset: accuracy against IPC."""
    figures = {}
    board = boards["lrs"]
    if board.empty:
        return figures
    for (dataset, ipc), sub in board[board["ipc"] != FULL_IPC].groupby(["dataset", "ipc"], sort=True):
        methods = list(dict.fromkeys(sub["method"].astype(str)))
        tag = f"{dataset}_ipc{ipc}"
        figures[f"radar_{tag}"] = viz.radar({m: radar_profile(boards, m, str(dataset), ipc) for m in methods},
                                            f"{dataset}, IPC {ipc}: scores normalised to [0, 1]")
        cells = {m: [r for text in sub[sub["method"] == m]["runs"] for r in str(text).split()] for m in methods}
        figures[f"training_loss_{tag}"] = viz.loss_curves(
            {m: evals.loss_curves(cells[m], "syn_hard") for m in methods},
            f"{dataset}, IPC {ipc}: training loss on each set (hard labels; band: min to max over seeds)")
        matrices = {}
        for m in methods:
            matrix, classes, models = evals.confusion_counts(cells[m], "syn_hard")
            if matrix is not None:
                matrices[f"{m} ({models} seed{'s' if models != 1 else ''})"] = (matrix, classes)
        figures[f"confusion_{tag}"] = viz.confusion_grid(matrices, f"{dataset}, IPC {ipc}: confusion matrices of "
                                                                   "the models trained on each set (rows normalised)")
    for dataset in sorted(board["dataset"].astype(str).unique()):
        points, full, what = ipc_points(boards, dataset, [m for m in board["method"].astype(str).unique()
                                                          if m not in ("full",)])
        if not points.empty and points["ipc"].nunique() > 1:
            figures[f"accuracy_vs_ipc_{dataset}"] = viz.accuracy_vs_ipc(
                points, None, full, f"{dataset}: accuracy against IPC ({what}; 95 % intervals)")
    return {k: v for k, v in figures.items() if v is not None}


def _grid_tiles(png: bytes, rows: int, columns: int | None, tile: list | None, padding: int = 2):
    """The tiles of a set's grid PNG (:func:`ddlib.data.distilled.grid_tensor`: one line per class,
    ``padding`` pixels between tiles) as classes x images x H x W x C in [0, 1]; None where the PNG
    does not have that layout. Without ``tile`` the tiles are taken as square."""
    import numpy as np
    from PIL import Image

    image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=float) / 255.0
    height, width = image.shape[:2]
    if rows < 1 or (height - padding) % rows:
        return None
    h = (height - padding) // rows - padding
    w = tile[1] if tile else h
    if columns is None:
        columns = (width - padding) // (w + padding) if w + padding > 0 else 0
    if h < 1 or columns < 1 or (tile and tile[0] != h) or columns * (w + padding) + padding != width:
        return None
    tiles = np.stack([np.stack([image[padding + r * (h + padding):padding + r * (h + padding) + h,
                                      padding + c * (w + padding):padding + c * (w + padding) + w]
                                for c in range(columns)]) for r in range(rows)])
    gray = np.allclose(tiles[..., 0], tiles[..., 1]) and np.allclose(tiles[..., 0], tiles[..., 2])
    return tiles[..., :1] if gray else tiles


def set_grid_png(runs: list[str], ipc: int) -> tuple[bytes | None, str]:
    """The set's images as logged by its first cell that has them, labelled with the dataset's class
    names and sized for a screen (:func:`ddlib.report.viz.set_grid`), and a caption. The names and
    layout come from the set's ``sets/distilled.json``; for cells logged before it carried them, from
    the confusion counts' classes (the layout then inferred, square tiles). Without either, the
    logged PNG as it is."""
    from ddlib.report.html import figure_png

    for run_id in runs:
        data = evals.artifact_bytes(run_id, "images/distilled.png")
        if not data:
            continue
        info = evals.artifact_bytes(run_id, "sets/distilled.json")
        info = json.loads(info) if info else {}
        names = info.get("classes") or evals.confusion_counts([run_id], "syn_hard")[1]
        grid = info.get("grid") or {}
        rows = int(grid.get("rows") or len(names))
        tiles = _grid_tiles(data, rows, grid.get("columns"), grid.get("tile"), int(grid.get("padding", 2))) \
            if rows else None
        if tiles is None:
            return data, "The set's images, one row per class (class names not recorded)"
        shown = tiles.shape[1]
        what = ("all images" if ipc == FULL_IPC else f"IPC {ipc}") \
            + (f", the first {shown} images of each class" if ipc == FULL_IPC or ipc > shown else "")
        fig = viz.set_grid(tiles, names or [str(i) for i in range(rows)], f"The set's images ({what})")
        return figure_png(fig), f"The set's images ({what}), labelled with their classes"
    return None, ""
