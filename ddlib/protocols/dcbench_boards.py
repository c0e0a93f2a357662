"""DC-Bench's boards (of the augmentation, compression, transfer and nas protocols) and their report
sections, from MLflow: augmentation (none / avg / best), accuracy against IPC with where
synthesis stops beating selection, transfer across architectures (DC-Bench's four-architecture
"Transfer" average beside the mean over all) with Kendall's tau of the method ranking, and NAS
rank correlation (rho, tau, Top-1) of the seed-averaged proxy accuracies. A transfer row without
DC-Bench's four architectures has no ``acc_transfer``; its ``acc_others_avg`` is never shown under
DC-Bench's name (the radar gives it its own axis, :func:`ddlib.report.plots.radar_profile`). Derived
tables (``transfer_tau``) and report sections: :func:`transfer_tau`, :func:`section`."""

from __future__ import annotations

import json

import pandas as pd
import scipy.stats

from ddlib.boards.rank import INTERVALS, aggregate, leakage_note
from ddlib.boards.read import per_seed_values
from ddlib.protocols import beyond
from ddlib.protocols.dcbench import best_by_mean
from ddlib.protocols.nas_space import rank_correlation
from ddlib.protocols.spec import board_score
from ddlib.scores import stats

__all__ = ["augmentation_leaderboard", "compression_leaderboard", "plot_compression", "synthesis_vs_selection",
           "transfer_leaderboard", "transfer_tau", "nas_leaderboard", "SELECTION", "section"]

# real-image selection baselines; everything else but "full" is a method
SELECTION = ("random", "kcenter", "kcenter_greedy", "herding", "herding_dc", "forgetting", "el2n", "aum", "ccs")


def _accuracies(experiment: str, row_params, keys=()) -> pd.DataFrame:
    return per_seed_values(experiment, keys, row_params,
                           match=lambda k: k.startswith("acc_") or k == "relative" or beyond.is_beyond(k))


def _value_columns(df: pd.DataFrame, first=(), roles: tuple[str, ...] = ()) -> list[str]:
    """The accuracy columns (``first`` first); with ``roles``, then the calibration, fairness and cost
    columns of the first of those roles the cells logged (:func:`ddlib.protocols.beyond.board_columns`)."""
    rest = sorted(c for c in df.columns if (c.startswith("acc_") or c == "relative") and c not in first)
    return [*[c for c in first if c in df.columns], *rest, *(beyond.board_columns(df, roles) if roles else [])]


def augmentation_leaderboard(experiment: str = "augmentation") -> pd.DataFrame:
    """Per dataset x IPC x method x model: accuracy under each augmentation, without augmentation,
    the mean over the augmentations and the best (DC-Bench's: the augmentation with the highest
    mean over the pooled seeds, named in ``aug_best``, with its own mean, std and interval); mean
    and std over seeds."""
    rows = ("dataset", "ipc", "method", "model")
    df = _accuracies(experiment, rows)
    if df.empty:
        return df
    cols = _value_columns(df, first=("acc_noaug", "acc_aug_avg"), roles=("syn-none",))
    cols = [c for c in cols if c not in ("acc_none", "acc_aug_best")]  # none is shown as acc_noaug; best below
    board = aggregate(df, cols, rows, sort=("dataset", "ipc"), descending="acc_aug_avg" if "acc_aug_avg" in cols else None)
    augmented = [c for c in cols if c.startswith("acc_") and c not in ("acc_noaug", "acc_aug_avg")]
    best = []
    for _, row in board.iterrows():
        means = {c: [row[f"{c}_mean"]] for c in augmented if pd.notna(row[f"{c}_mean"])}
        best.append(best_by_mean(means) if means else None)
    at = board.columns.get_loc("acc_aug_avg_high") + 1 if "acc_aug_avg_high" in board else len(board.columns)
    board.insert(at, "aug_best", [b[len("acc_"):] if b else None for b in best])
    for stat in ("mean", "std", "low", "high"):
        board[f"acc_aug_best_{stat}"] = [row[f"{b}_{stat}"] if b else float("nan")
                                         for b, (_, row) in zip(best, board.iterrows())]
    return board


def compression_leaderboard(experiment: str = "compression") -> pd.DataFrame:
    """Per dataset x model x method x IPC: the set's accuracy, the full data's, and their ratio."""
    rows = ("dataset", "model", "method", "ipc")
    df = _accuracies(experiment, rows, keys=("acc_set",))
    if df.empty:
        return df
    board = aggregate(df, _value_columns(df, first=("acc_set", "acc_full", "relative"), roles=("syn-set",)), rows,
                      descending=board_score("compression"))
    order = ["dataset", "model", *(["unranked"] if "unranked" in board else []), "method", "ipc"]  # unranked rows last
    return board.sort_values(order, key=lambda c: c.astype(str) if c.name != "ipc" else c).reset_index(drop=True)


def synthesis_vs_selection(board: pd.DataFrame) -> pd.DataFrame:
    """For each synthetic method and IPC: its margin over the best selection baseline (random,
    K-Center, the coresets) at the same IPC, and the largest IPC up to which it beats selection at every IPC.
    Methods are compared within one *family* of cells (the same data, model, recipe, augmentation)."""
    if board.empty:
        return pd.DataFrame()
    out = []
    for _, sub in board.groupby("family", sort=False):
        selection = sub[sub["method"].isin(SELECTION)].groupby("ipc")["acc_set_mean"].max()
        for method, rows in sub[~sub["method"].isin((*SELECTION, "full"))].groupby("method", sort=False):
            found = []
            for _, r in rows.sort_values("ipc").iterrows():
                if r["ipc"] in selection.index:
                    margin = r["acc_set_mean"] - selection[r["ipc"]]
                    found.append({"dataset": r["dataset"], "data": r.get("data"), "model": r["model"], "method": method,
                                  "ipc": r["ipc"],
                                  "acc": r["acc_set_mean"], "best_selection": selection[r["ipc"]], "margin": margin,
                                  "beats_selection": margin > 0})
            beaten_until = None
            for row in found:  # the IPCs up to the first one where selection wins
                if not row["beats_selection"]:
                    break
                beaten_until = row["ipc"]
            out += [{**row, "beats_selection_up_to_ipc": beaten_until} for row in found]
    return pd.DataFrame(out)


def plot_compression(board: pd.DataFrame):
    """Accuracy (%) against IPC, one line per method, the full-data accuracy as a dashed line."""
    import matplotlib.pyplot as plt

    if board.empty:
        return None
    groups = list(board.groupby("family", sort=False))  # one panel per setting (data, model, recipe)
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4), squeeze=False)
    for ax, (family, sub) in zip(axes[0], groups):
        dataset, model = sub["dataset"].iloc[0], sub["model"].iloc[0]
        if "data" in sub and isinstance(sub["data"].iloc[0], str):
            dataset = sub["data"].iloc[0]  # the data source, e.g. "CIFAR-10 (JPEG)"
        for method, rows in sub[sub["method"] != "full"].groupby("method", sort=False):
            rows = rows.sort_values("ipc")
            ax.errorbar(rows["ipc"], 100 * rows["acc_set_mean"], yerr=100 * rows["acc_set_std"], marker="o",
                        capsize=3, label=str(method), linestyle="--" if method in SELECTION else "-")
        full = sub["acc_full_mean"].dropna() if "acc_full_mean" in sub else pd.Series(dtype=float)
        if len(full):
            ax.axhline(100 * full.mean(), color="black", linestyle=":", label="full data")
        ax.set_xscale("log")
        ax.set_xlabel("images per class")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"{dataset}, {model}: accuracy against IPC" + (f" [{family[:6]}]" if len(groups) > 1 else ""))
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def transfer_leaderboard(experiment: str = "transfer") -> pd.DataFrame:
    """Per dataset x IPC x method (x reference model): accuracy on every architecture, on the
    reference, DC-Bench's "Transfer" average (``acc_transfer``: MLP, ResNet-18, ResNet-152, ViT)
    and the mean over all the others (``acc_others_avg``); mean and std over seeds."""
    rows = ("dataset", "ipc", "method", "model")
    df = _accuracies(experiment, rows, keys=("acc_reference",))
    if df.empty:
        return df
    return aggregate(df, _value_columns(df, first=("acc_reference", "acc_transfer", "acc_others_avg")), rows,
                     sort=("dataset", "ipc"), descending=board_score("transfer"))


def transfer_tau(board: pd.DataFrame) -> pd.DataFrame:
    """Is the ranking of methods preserved? Kendall's tau (tau-b) between the methods' mean accuracy
    on the reference model and on each other architecture, per dataset x IPC within one family of
    cells (same recipe and architectures for every method; needs 2+ methods)."""
    if board.empty:
        return pd.DataFrame()
    archs = [c[len("acc_"):-len("_mean")] for c in board.columns if c.startswith("acc_") and c.endswith("_mean")
             and c not in ("acc_reference_mean", "acc_transfer_mean", "acc_others_avg_mean")]
    out = []
    for (_, ipc), sub in board.groupby(["family", "ipc"], sort=False):
        dataset, reference = sub["dataset"].iloc[0], sub["model"].iloc[0]
        if len(sub) < 2:
            continue
        for arch in archs:
            if arch == reference or sub[f"acc_{arch}_mean"].isna().any():
                continue
            tau = scipy.stats.kendalltau(sub["acc_reference_mean"], sub[f"acc_{arch}_mean"]).statistic
            out.append({"dataset": dataset, "data": sub["data"].iloc[0] if "data" in sub else None, "ipc": ipc,
                        "reference": reference, "model": arch,
                        "methods": len(sub), "tau": float(tau), "ranking_preserved": bool(tau == 1.0)})
    return pd.DataFrame(out)


NAS_VALUES = ("spearman", "kendall", "top1", "best_possible")


def nas_leaderboard(experiment: str = "nas") -> pd.DataFrame:
    """Per dataset x IPC x method (x sample, proxy): Spearman's rho, Kendall's tau and the Top-1
    ground-truth accuracy (percent) of the proxy's best architecture, as DC-Bench defines them: on
    the proxy accuracies averaged over the seeds pooled from every run of the row (``<value>_mean``;
    never a mean of per-seed correlations). ``<value>_low`` / ``_high``: the bootstrap interval over
    seeds of that statistic (seeds resampled, proxies averaged, correlated again); ``_std`` is NaN
    (one value, not a mean). ``spearman_per_seed``: each seed's own rho, for rank stability only."""
    rows = ("dataset", "ipc", "method", "num_archs", "arch_seed", "sampling", "C", "N")
    df = per_seed_values(experiment, (), rows, match=lambda k: k.startswith(("proxy.", "gt.")))
    if df.empty or not any(c.startswith("proxy.") for c in df.columns):
        return pd.DataFrame()
    out = []
    for _, sub in df.groupby("group", sort=False):
        archs = sorted(c[len("proxy."):] for c in sub.columns if c.startswith("proxy.") and sub[c].notna().all())
        if len(archs) < 2:
            continue
        proxies = sub[[f"proxy.{a}" for a in archs]].to_numpy(dtype=float)  # seeds x architectures
        truth = [float(sub[f"gt.{a}"].iloc[0]) for a in archs]
        first = sub.iloc[0]
        row = {**{k: first[k] for k in ("dataset", "data", *rows[1:])}, "precision": first.get("precision"),
               "set": first.get("set"), "series": first["series"],
               "family": first["family"], "seeds": len(sub), "archs": len(archs)}
        for value in NAS_VALUES:
            ci = stats.bootstrap_ci(proxies, lambda t, v=value: rank_correlation(t.mean(axis=0), truth)[v], **INTERVALS)
            row.update({f"{value}_mean": ci.estimate, f"{value}_std": float("nan"), f"{value}_low": ci.low,
                        f"{value}_high": ci.high})
        row["runs"] = " ".join(dict.fromkeys(sub["run_id"]))
        row["sanity"] = leakage_note(sub)
        row["spearman_per_seed"] = json.dumps({str(int(seed)): rank_correlation(p, truth)["spearman"]
                                               for seed, p in zip(sub["seed"], proxies)})
        out.append(row)
    board = pd.DataFrame(out)
    if board.empty:
        return board
    if not board.duplicated(subset=[k for k in (*rows, "precision") if k in board], keep=False).any():
        board = board.drop(columns="set")  # shown only where two rows differ by their set alone
    return board.sort_values(["dataset", "ipc", "spearman_mean"], ascending=[True, True, False]).reset_index(drop=True)


def section(name: str, board: pd.DataFrame, boards, plots: bool = True) -> tuple[dict, dict]:
    """What the report shows beside a DC-Bench board: for ``compression``, where synthesis stops beating
    selection and accuracy against IPC; for ``transfer``, Kendall's tau across architectures."""
    if name == "compression":
        return {"synthesis_vs_selection": synthesis_vs_selection(board)}, (
            {"compression": plot_compression(board)} if plots else {})
    if name == "transfer":
        return {"transfer_tau": boards["transfer_tau"]}, {}
    return {}, {}
