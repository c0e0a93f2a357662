"""Every leaderboard that has runs, as one report: what ``python -m ddlib summary`` prints and logs."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ddlib.report import beard, dcbench, ddranking
from ddlib.report.core import format_leaderboard

__all__ = ["Section", "build_report", "shown"]


@dataclass
class Section:
    title: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # name -> raw table (CSV); mean/std ones are formatted
    figures: dict = field(default_factory=dict)


def build_report(w: float = 0.5, gamma: float = 0.5, alpha: float = 0.5) -> list[Section]:
    """The sections with data, in the order DD-Ranking, BEARD, DC-Bench."""
    sections = []
    for name, board, weight in (("lrs", ddranking.lrs_leaderboard(w=w), f"w = {w}"),
                                ("ars", ddranking.ars_leaderboard(gamma=gamma), f"gamma = {gamma}")):
        if not board.empty:
            title = {"lrs": "Label-Robust Score", "ars": "Augmentation-Robust Score"}[name]
            sections.append(Section(f"DD-Ranking: {title} ({weight}); accuracies and differences in %, scores 0-100",
                                    {name: board, f"{name}_sweep": ddranking.weight_sweep(name)},
                                    {name: ddranking.plot_scores(board, name)}))
    robust = beard.robustness_leaderboard(alpha=alpha)
    if not robust.empty:
        curves = beard.eps_curves()
        tables = {"beard": robust, "beard_unified": beard.unified_leaderboard(alpha=alpha)}
        if not curves.empty:
            tables["beard_eps_curves"] = curves
        sections.append(Section(f"BEARD: RR, AE, CREI (alpha = {alpha}) and RCR, 0-100; accuracies in %, times in s",
                                tables, {"beard_eps_curves": beard.plot_eps_curves(curves)}))
    for title, name, board, extra in (
            ("DC-Bench: accuracy (%) under each augmentation", "augmentation", dcbench.augmentation_leaderboard(), None),
            ("DC-Bench: accuracy (%) against images per class", "compression", dcbench.compression_leaderboard(),
             "compression"),
            ("DC-Bench: accuracy (%) across architectures", "transfer", dcbench.transfer_leaderboard(), "transfer"),
            ("DC-Bench: NAS rank correlation (rho, tau) and Top-1 ground truth (%)", "nas", dcbench.nas_leaderboard(),
             None)):
        if board.empty:
            continue
        section = Section(title, {name: board})
        if extra == "compression":
            section.tables["synthesis_vs_selection"] = dcbench.synthesis_vs_selection(board)
            section.figures["compression"] = dcbench.plot_compression(board)
        elif extra == "transfer":
            section.tables["transfer_tau"] = dcbench.transfer_tau(board)
        sections.append(section)
    return sections


def shown(table: pd.DataFrame) -> pd.DataFrame:
    """A table as printed: mean/std columns formatted, others as they are."""
    return format_leaderboard(table) if any(c.endswith("_mean") for c in table.columns) else table
