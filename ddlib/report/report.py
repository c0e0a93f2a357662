"""Every leaderboard that has runs, as one report: what ``python -m ddlib summary`` prints and logs."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ddlib.report import beard, dcbench, ddranking
from ddlib.report.boards import load_boards, one_read
from ddlib.report.core import INTERVALS, format_leaderboard
from ddlib.report.plots import eps_curve_figures, summary_figures
from ddlib.report.stability import stability_table
from ddlib.stats import describe_method

__all__ = ["Section", "build_report", "shown", "RANK_NOTE"]

RANK_NOTE = (f"rank: 1 + the methods significantly better in the same setting (paired by seed, 95 % bootstrap "
             f"interval of the difference excludes 0): equal ranks and 'tied with' are not significantly different; "
             f"{describe_method(**INTERVALS)}")


@dataclass
class Section:
    title: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # name -> raw table (CSV); mean/std ones are formatted
    figures: dict = field(default_factory=dict)
    caption: str = ""


@one_read()
def build_report(w: float = 0.5, gamma: float = 0.5, alpha: float = 0.5, plots: bool = True,
                 stability: bool = True) -> list[Section]:
    """The sections with data, in the order DD-Ranking, BEARD, DC-Bench; then the rank stability
    (Kendall tau across seeds, architectures and weights) and the plots (radar, accuracy against IPC,
    training loss, confusion matrices), where there is data for them. ``plots=False``: no figure is
    drawn (``summary --no-log`` prints tables only)."""
    boards = load_boards(w, gamma, alpha)
    sections = []
    for name, weight in (("lrs", f"w = {w}"), ("ars", f"gamma = {gamma}")):
        board = boards[name]
        if not board.empty:
            title = {"lrs": "Label-Robust Score", "ars": "Augmentation-Robust Score"}[name]
            sections.append(Section(f"DD-Ranking: {title} ({weight}); accuracies and differences in %, scores 0-100",
                                    {name: board, f"{name}_sweep": ddranking.weight_sweep(name)},
                                    {name: ddranking.plot_scores(board, name)} if plots else {}))
    from ddlib.report.published import published_table

    published = published_table()
    if not published.empty:
        sections.append(Section("Published rows (ddlib import): as published, not measured here, never pooled with "
                                "the rows above", {"published": published}))
    robust = boards["beard"]
    if not robust.empty:
        curves = boards["eps_curves"]
        tables = {"beard": robust, "beard_unified": boards["beard_unified"]}
        if not curves.empty:
            tables["beard_eps_curves"] = curves
        sections.append(Section(f"BEARD: RR, AE, CREI (alpha = {alpha}) and RCR, 0-100; accuracies in %, times in s",
                                tables, {"beard_eps_curves": beard.plot_eps_curves(curves), **eps_curve_figures(curves)}
                                if plots else {}))
    for title, name, extra in (
            ("DC-Bench: accuracy (%) under each augmentation", "augmentation", None),
            ("DC-Bench: accuracy (%) against images per class", "compression", "compression"),
            ("DC-Bench: accuracy (%) across architectures", "transfer", "transfer"),
            ("DC-Bench: NAS rank correlation (rho, tau) and Top-1 ground truth (%)", "nas", None)):
        board = boards[name]
        if board.empty:
            continue
        section = Section(title, {name: board})
        if extra == "compression":
            section.tables["synthesis_vs_selection"] = dcbench.synthesis_vs_selection(board)
            if plots:
                section.figures["compression"] = dcbench.plot_compression(board)
        elif extra == "transfer":
            section.tables["transfer_tau"] = boards["transfer_tau"]
        sections.append(section)
    for section in sections:
        if any("rank" in t for t in section.tables.values()):
            section.caption = RANK_NOTE
    if sections and stability:
        table = stability_table(boards.tables)
        if not table.empty:
            sections.append(Section("Rank stability: Kendall tau of the method ranking across seeds, architectures and "
                                    "the w / gamma / alpha weights (against the leaderboard's own ranking)",
                                    {"rank_stability": table}))
    if sections and plots:
        figures = summary_figures(boards)
        if figures:
            sections.append(Section("Plots: scores (radar), accuracy against IPC, training loss and confusion matrices "
                                    "of the models trained on each set", {}, figures))
    return sections


def shown(table: pd.DataFrame) -> pd.DataFrame:
    """A table as printed: mean/std columns formatted, others as they are."""
    return format_leaderboard(table) if any(c.endswith("_mean") for c in table.columns) else table
