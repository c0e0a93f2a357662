"""BEARD's boards (the adversarial protocol's) from its experiment: RR, AE, CREI and RCR per dataset x IPC,
"unified" over IPCs (RRM, AEM, CREI over the models of every IPC), robust accuracy against epsilon and
its figures, and the board's report section (:func:`section`).

Scores are recomputed here from the logged per-seed accuracies and times (so ``alpha`` can
change), with BEARD's formulas (:func:`ddlib.scores.metrics.beard_scores`: percent and seconds). Skipped
attacks (targeted DeepFool, AutoAttack) have no values and are left out, as BEARD leaves out its
None; with fewer than two attacks that ran, RR, AE and CREI are NaN (one attack gives 0, 100, 50
whatever the model). Beside BEARD's RR, its toolkit's ``rome`` and ``rome+`` variants
(``rr_rome``, ``rr_rome_plus``; BEARD's Table 15 is ``rome``); ``rr_variant`` says which one CREI
uses (BEARD's toolkit's ``metrics_type``); ``crei_rome`` is ROME's I-CREI (CREI on ``rr_rome``, ROME's
I-RR). Per attack of a cell's ``eps_curve``, ``curve_auc.<attack>``: the area under its robust accuracy
against epsilon, over the epsilon range (:func:`ddlib.scores.robustness.curve_auc`, a fraction). AE
compares the attack times with the clean time of the
same cell (``clean_time="mode"``, as BEARD's published tables do), NaN for a seed whose attacks were
timed in several processes (see :mod:`ddlib.protocols.adversarial`); ``clean_time="min_of_modes"``
takes the smaller of the targeted and untargeted cells' clean times of the same models, as BEARD's
metric toolkit does: a targeted row (any target kind) pairs with the untargeted row, the untargeted
row with the targeted row of BEARD's targets (``next``, else ``next_mod10``; never ``random``).
Rows whose pair has not run get no AE; the pair's clean time was timed in its own cell's process
(BEARD timed both modes in one). ``space`` and ``target`` are row columns: ``beard_compat`` rows are
never pixel-space, targeted rows of two target kinds never one row.
"""

from __future__ import annotations

import json

import pandas as pd

from ddlib.boards.rank import aggregate, leakage_note
from ddlib.boards.read import per_seed_values
from ddlib.protocols.common import FULL_IPC
from ddlib.scores import metrics
from ddlib.scores.robustness import curve_auc, curve_aucs
from ddlib.store.tags import TAG
from ddlib.store.tracking import client

__all__ = ["ROW_PARAMS", "robustness_leaderboard", "unified_leaderboard", "eps_curves", "plot_eps_curves",
           "eps_curve_figures", "section"]

ROW_PARAMS = ("dataset", "ipc", "method", "model", "training", "mode", "target", "space", "attacks", "device")
PAIR_TARGETS = ("next", "next_mod10")  # BEARD's targets: the targeted row an untargeted one pairs with
EXPERIMENT = "adversarial"
_ATTACK_VALUES = (".robust_acc", ".asr", ".asr_beard", ".attack_seconds", ".queries", ".timing_process")


def _values(experiment: str) -> pd.DataFrame:
    """Per-seed values; ``attacks`` shown by name, ``device`` is what the timings ran on (RR and AE
    compare the attacks of one row: rows with other attacks or another device are other rows)."""
    df = per_seed_values(experiment, ("clean_acc", "clean_seconds"), ROW_PARAMS[:-1],
                         match=lambda k: k.endswith(_ATTACK_VALUES) or k.startswith("curve."),
                         row_tags={"device": TAG["device_name"]})
    if not df.empty:
        df["attacks"] = [",".join(_names(a)) for a in df["attacks"]]
        df["training"] = [t if isinstance(t, str) else json.dumps(t) for t in df["training"]]
        df["target"] = [t if m == "targeted" else "" for t, m in zip(df["target"], df["mode"])]
    return df


def _names(attacks) -> list[str]:
    if isinstance(attacks, str):
        attacks = json.loads(attacks) if attacks.startswith("[") else [attacks]
    return [a if isinstance(a, str) else next(iter(a)) for a in attacks or []]


def _attacks(df: pd.DataFrame) -> list[str]:
    return [c[: -len(".robust_acc")] for c in df.columns if c.endswith(".robust_acc")]


def _clean_times(df: pd.DataFrame, rule: str) -> pd.Series:
    """Per row, the clean time AE compares with (:func:`ddlib.scores.metrics.beard_clean_time`); NaN where
    the row's own is NaN (timed in several processes), or where ``min_of_modes`` finds no paired row
    of the other mode for the same models, seed and device (see the module docstring)."""
    if rule not in metrics.CLEAN_TIMES:
        raise ValueError(f"clean_time must be one of {metrics.CLEAN_TIMES}, got {rule!r}")
    if rule == "mode":
        return df["clean_seconds"]
    pairs = {run: client().get_run(run).data.tags.get(TAG["mode_pair"]) for run in df["run_id"].unique()}
    df = df.assign(mode_pair=df["run_id"].map(pairs))
    out = []
    for _, row in df.iterrows():
        other = df[(df["mode_pair"] == row["mode_pair"]) & (df["seed"] == row["seed"]) & (df["device"] == row["device"])
                   & (df["mode"] != row["mode"])]
        if row["mode"] != "targeted":  # BEARD's toolkit pairs its untargeted loop with its (y + 1) % 10 one
            kinds = [k for k in PAIR_TARGETS if (other["target"] == k).any()]
            other = other[other["target"] == kinds[0]] if kinds else other.iloc[:0]
        own = row["clean_seconds"]
        out.append(float("nan") if other.empty or pd.isna(row["mode_pair"]) or pd.isna(own)
                   or pd.isna(other["clean_seconds"].iloc[-1]) else
                   metrics.beard_clean_time(own, float(other["clean_seconds"].iloc[-1]), rule))
    return pd.Series(out, index=df.index, dtype=float)


def _ran(row: pd.Series, attacks: list[str], value: str, scale: float = 1.0) -> list[float]:
    """The attacks that ran for this row (skipped ones have no value)."""
    return [scale * row[f"{a}.{value}"] for a in attacks if pd.notna(row.get(f"{a}.{value}"))]


def robustness_leaderboard(experiment: str = EXPERIMENT, alpha: float = 0.5, clean_time: str = "mode",
                           rr_variant: str = "beard") -> pd.DataFrame:
    """One row per dataset x IPC x method x model x training x mode x target x space: clean
    accuracy, each attack's robust accuracy, ASR and time, BEARD's RR and its ``rome``/``rome+``
    variants, AE (against ``clean_time``: see the module docstring), CREI (``alpha``, on the
    ``rr_variant`` RR) and the monotone RCR; mean and std over seeds."""
    df = _values(experiment)
    if df.empty:
        return df
    attacks = _attacks(df)
    rows = [metrics.beard_scores(100 * row["clean_acc"], _ran(row, attacks, "robust_acc", 100), t_clean,
                                 _ran(row, attacks, "attack_seconds"), alpha, rr_variant)
            for (_, row), t_clean in zip(df.iterrows(), _clean_times(df, clean_time))]
    df = df.assign(**pd.DataFrame(rows, index=df.index))
    aucs = pd.DataFrame([curve_aucs(_own_curves(row)) for _, row in df.iterrows()], index=df.index)
    df = df.assign(**aucs)
    per_attack = [f"{a}.{v}" for a in attacks for v in ("robust_acc", "asr", "asr_beard", "attack_seconds", "queries")]
    return aggregate(df, ["clean_acc", "rr", "rr_rome", "rr_rome_plus", "ae", "crei", "crei_rome", "rcr",
                          "clean_seconds", *per_attack, *aucs.columns], ROW_PARAMS,
                     sort=("dataset", "mode", "family", "ipc"), descending="crei")


def unified_leaderboard(experiment: str = EXPERIMENT, alpha: float = 0.5, clean_time: str = "mode",
                        rr_variant: str = "beard") -> pd.DataFrame:
    """BEARD's multi-adversary scores over IPCs: per dataset x method x model x training x mode x
    target x space and seed, RRM (and its ``rome``/``rome+`` variants) / AEM pool the attack values of
    the models of every IPC against their mean clean value (:func:`ddlib.scores.metrics.rr_multi`; clean
    times by ``clean_time``), CREI from them (``rr_variant``), and RCR likewise; mean and std over seeds.
    The IPC cells are usually timed in different processes (a grid runs each cell in its own), whose
    loads differ: AEM then pools times that are not comparable, and the row's ``sanity`` says so
    (:func:`_timing_note`), as a cell flags a row's AE timed in several processes."""
    df = _values(experiment)
    if df.empty:
        return df
    attacks = _attacks(df)
    df = df.assign(clean_seconds=_clean_times(df, clean_time))
    keys = [p for p in ROW_PARAMS if p != "ipc"]
    rows = []
    # one series: the same configuration at every IPC (never cells of another recipe, attack list or subset)
    for (key, seed), sub in df.groupby(["series", "seed"], sort=False):
        # one set per IPC: where a method's set changed (another set digest at one IPC) the later row wins,
        # and the sets are part of the row's key below, so seeds over other sets form another row
        sub = sub.drop_duplicates("ipc", keep="last") if "set" in sub else sub
        first = sub.iloc[0]
        scores = metrics.beard_scores_multi([100 * c for c in sub["clean_acc"]],
                                            [_ran(r, attacks, "robust_acc", 100) for _, r in sub.iterrows()],
                                            list(sub["clean_seconds"]),
                                            [_ran(r, attacks, "attack_seconds") for _, r in sub.iterrows()],
                                            alpha, rr_variant)
        rows.append({"group": key, "seed": seed, "family": first["family"], "data": first.get("data"),
                     "timing": _timing_note(sub, attacks),
                     **{k: first[k] for k in keys}, "precision": first.get("precision"),
                     "ipcs": ",".join("all" if i == FULL_IPC else str(i) for i in sorted(sub["ipc"].unique())),
                     **scores,
                     "sets": ",".join(str(v) for v in sub.sort_values("ipc")["set"]) if "set" in sub else "",
                     "leakage": leakage_note(sub)})
    out = pd.DataFrame(rows)
    # the IPC list is part of a row: seeds missing at one IPC make a different row, never a silent mix
    out["group"] = out["group"] + "|" + out["ipcs"] + "|" + out.pop("sets")
    out["timing"] = out.groupby("group", sort=False)["timing"].transform(
        lambda notes: "; ".join(filter(None, dict.fromkeys(notes))))  # one note per row, over its seeds
    board = aggregate(out, ["rrm", "rrm_rome", "rrm_rome_plus", "aem", "creim", "creim_rome", "rcrm"],
                      [*keys, "ipcs", "timing"], sort=("dataset", "mode", "family"), descending="creim")
    if board.empty:
        return board
    board["sanity"] = ["; ".join(filter(None, (str(s) if isinstance(s, str) else "", t)))
                       for s, t in zip(board.get("sanity", [""] * len(board)), board.pop("timing"))]
    return board


def _timing_note(sub: pd.DataFrame, attacks: list[str]) -> str:
    """Where the attack times of one seed's IPC rows come from several processes: a note naming how
    many (AEM pools them; each row's own AE compares one process's times only)."""
    columns = [f"{a}.timing_process" for a in attacks if f"{a}.timing_process" in sub]
    processes = {float(v) for v in sub[columns].to_numpy().ravel() if pd.notna(v)} if columns else set()
    if len(processes) < 2:
        return ""
    return (f"AEM pools attack times from {len(processes)} processes (the IPC cells were timed apart), whose loads "
            "differ: compare AEM only between rows timed together")


def eps_curves(experiment: str = EXPERIMENT) -> pd.DataFrame:
    """Robust accuracy against epsilon: one row per (leaderboard row, attack, epsilon), mean and std
    over seeds (from the cells run with ``eps_curve``)."""
    df = _values(experiment)
    if df.empty:
        return df
    points = [c for c in df.columns if c.startswith("curve.")]
    rows = []
    for column in points:
        _, attack, eps = column.split(".", 2)
        for group, sub in df.dropna(subset=[column]).groupby("group", sort=False):
            mean, std = metrics.mean_std(sub[column])
            rows.append({**{p: sub[p].iloc[0] for p in ROW_PARAMS}, "precision": sub["precision"].iloc[0],
                         "group": group, "attack": attack,
                         "eps": float(eps), "robust_acc_mean": mean, "robust_acc_std": std, "seeds": len(sub)})
    if not rows:
        return pd.DataFrame()
    return pd.DataFrame(rows).sort_values([*ROW_PARAMS, "attack", "eps"], key=lambda c: c.astype(str)
                                          if c.name != "eps" else c).reset_index(drop=True)


def plot_eps_curves(curves: pd.DataFrame):
    """One line per (method, IPC, training, mode, attack): robust accuracy (%) against epsilon (x 255)."""
    import matplotlib.pyplot as plt

    if curves.empty:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    lines = curves.groupby(["group", "attack"], sort=False)
    names = {}
    for (group, attack), sub in lines:
        first = sub.iloc[0]
        ipc = "all" if first["ipc"] == FULL_IPC else first["ipc"]
        label = f"{first['method']} IPC {ipc}" + (f" {first['training']}" if first["training"] != "standard" else "")
        label += f", {attack} {first['mode']}" + (f" [{first['space']}]" if first.get("space") not in (None, "pixel") else "")
        if curves["dataset"].nunique() > 1:
            label = f"{first['dataset']}: {label}"
        names.setdefault(label, []).append(group)
        if len(names[label]) > 1:  # the same row in two configurations: say which
            label += f" [{group[:6]}]"
        sub = sub.sort_values("eps")
        ax.errorbar(sub["eps"] * 255, 100 * sub["robust_acc_mean"], yerr=100 * sub["robust_acc_std"], marker="o",
                    capsize=3, label=label)
    compat = set(curves.get("space", pd.Series(dtype=object)).dropna()) - {"pixel"}
    ax.set_xlabel("epsilon (x 1/255, " + ("normalised units for beard_compat lines)" if compat else "pixel space)"))
    ax.set_ylabel("robust accuracy (%)")
    ax.set_title("Robust accuracy against epsilon (mean ± std over seeds)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def _own_curves(row: pd.Series) -> dict[str, float]:
    """The ``curve.<attack>.<eps>`` points of a per-seed row's own curves: the frame holds every
    cell's points (NaN where a cell has no such curve), so an attack none of whose points this row
    has is left out, while a missing point of a curve it has stays NaN (its area is NaN, not the area
    of a shorter curve)."""
    points = {k: v for k, v in row.items() if isinstance(k, str) and k.startswith("curve.")}
    has = {k.split(".")[1] for k, v in points.items() if pd.notna(v)}
    return {k: v for k, v in points.items() if k.split(".")[1] in has}


def _row_label(first: pd.Series, with_dataset: bool = False) -> str:
    ipc = "all" if first["ipc"] == FULL_IPC else first["ipc"]
    label = f"{first['method']} IPC {ipc}"
    for key, plain in (("model", None), ("training", "standard"), ("space", "pixel")):
        value = first.get(key)
        if value is not None and value == value and value != plain and not (key == "model" and value == "convnet"):
            label += f" {value}"
    return f"{first['dataset']}: {label}" if with_dataset else label


def _curve_figure(lines: dict[str, pd.DataFrame], title: str, compat: bool):
    """One errorbar line per entry (robust accuracy in % against eps x 255), its AUC in the legend."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label, sub in lines.items():
        sub = sub.sort_values("eps")
        auc = curve_auc(list(sub["eps"]), list(sub["robust_acc_mean"]))
        ax.errorbar(sub["eps"] * 255, 100 * sub["robust_acc_mean"], yerr=100 * sub["robust_acc_std"].fillna(0),
                    marker="o", capsize=3, label=f"{label} (AUC {100 * auc:.1f} %)" if auc == auc else label)
    ax.set_xlabel("epsilon (x 1/255, " + ("normalised units: beard_compat)" if compat else "pixel space)"))
    ax.set_ylabel("robust accuracy (%)")
    ax.set_title(title, fontsize="medium")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def eps_curve_figures(curves: pd.DataFrame) -> dict:
    """Robustness curves (:func:`ddlib.report.eps_curves`): per leaderboard row, one figure with a
    line per attack (``eps_row_<n>``); per dataset x IPC x mode x target x space x attack with
    several rows (methods, trainings, models), one figure with a line per row (``eps_methods_<n>``).
    Legends carry each line's AUC (the mean curve's, the mean of the seeds' ``curve_auc``)."""
    if curves is None or curves.empty:
        return {}
    figures = {}
    many = curves["dataset"].nunique() > 1
    for n, (_, sub) in enumerate(curves.groupby("group", sort=False)):
        first = sub.iloc[0]
        lines = {str(attack): points for attack, points in sub.groupby("attack", sort=False)}
        title = f"{_row_label(first, many)}, {first['mode']}: robust accuracy against epsilon"
        figures[f"eps_row_{n}"] = _curve_figure(lines, title, first.get("space") == "beard_compat")
    keys = [k for k in ("dataset", "ipc", "mode", "target", "space", "attack") if k in curves]
    for n, (_, sub) in enumerate(curves.groupby(keys, sort=False, dropna=False)):
        if sub["group"].nunique() < 2:
            continue
        lines = {}
        for group, points in sub.groupby("group", sort=False):
            label = _row_label(points.iloc[0])
            lines[label if label not in lines else f"{label} [{group[:6]}]"] = points
        first = sub.iloc[0]
        ipc = "all" if first["ipc"] == FULL_IPC else first["ipc"]
        title = f"{first['dataset']} IPC {ipc}, {first['attack']} {first['mode']}: one line per method"
        figures[f"eps_methods_{n}"] = _curve_figure(lines, title, first.get("space") == "beard_compat")
    return figures


def eps_curves_of(board: pd.DataFrame) -> pd.DataFrame:
    """The robustness curves read beside the ``beard`` board (empty where it is: no cell ran)."""
    return eps_curves() if not board.empty else pd.DataFrame()


def section(name: str, board: pd.DataFrame, boards, plots: bool = True) -> tuple[dict, dict]:
    """What the report shows beside the ``beard`` board: the unified board over IPCs, the robustness
    curves as a table and, with ``plots``, their figures (all rows; one per row; one per setting)."""
    curves = boards["eps_curves"]
    tables = {"beard_unified": boards["beard_unified"], **({"beard_eps_curves": curves} if not curves.empty else {})}
    return tables, ({"beard_eps_curves": plot_eps_curves(curves), **eps_curve_figures(curves)} if plots else {})
