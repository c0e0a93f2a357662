"""Every leaderboard that has runs, as one report: what ``python -m ddlib summary`` prints and logs."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ddlib.protocols.spec import all_specs
from ddlib.report import beard, dcbench, ddranking
from ddlib.report.boards import load_boards, one_read
from ddlib.report.core import INTERVALS, format_leaderboard
from ddlib.report.plots import eps_curve_figures, summary_figures
from ddlib.report.stability import stability_table
from ddlib.scores.stats import describe_method

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


# Titles that say more than a board's own (with its units); every other board is titled as its spec says.
TITLES = {
    "lrs": "DD-Ranking: Label-Robust Score{weight}; accuracies in %, differences in points, scores 0-100",
    "ars": "DD-Ranking: Augmentation-Robust Score{weight}; accuracies in %, differences in points, scores 0-100",
    "beard": "BEARD: RR, AE, CREI{weight} and RCR, 0-100; accuracies in %, times in s",
    "augmentation": "DC-Bench: accuracy (%) under each augmentation",
    "compression": "DC-Bench: accuracy (%) against images per class",
    "transfer": "DC-Bench: accuracy (%) across architectures",
    "nas": "DC-Bench: NAS rank correlation (rho, tau) and Top-1 ground truth (%)",
    "blackbox": "BEARD black-box: accuracy (%) under transfer (target x surrogate, per attack)",
    "privacy": "Privacy: membership inference (AUC 0-1, 0.5: no leak; lower is better, not ranked; TPR and "
               "accuracies in %)",
}
SHOWN_WITHIN = ("beard_unified",)  # shown in its protocol's first board's section


def _extras(section: Section, name: str, board: pd.DataFrame, boards, plots: bool) -> None:
    """What a board's section shows beside it: weight sweeps, BEARD's unified board and curves, ..."""
    if name in ("lrs", "ars"):
        section.tables[f"{name}_sweep"] = ddranking.weight_sweep(name)
        if plots:
            section.figures[name] = ddranking.plot_scores(board, name)
    elif name == "beard":
        curves = boards["eps_curves"]
        section.tables["beard_unified"] = boards["beard_unified"]
        if not curves.empty:
            section.tables["beard_eps_curves"] = curves
        if plots:
            section.figures.update({"beard_eps_curves": beard.plot_eps_curves(curves), **eps_curve_figures(curves)})
    elif name == "compression":
        section.tables["synthesis_vs_selection"] = dcbench.synthesis_vs_selection(board)
        if plots:
            section.figures["compression"] = dcbench.plot_compression(board)
    elif name == "transfer":
        section.tables["transfer_tau"] = boards["transfer_tau"]


@one_read()
def build_report(w: float = 0.5, gamma: float = 0.5, alpha: float = 0.5, plots: bool = True,
                 stability: bool = True) -> list[Section]:
    """The sections with data: every protocol's boards in report order (DD-Ranking, BEARD, DC-Bench,
    privacy: their specs); then the rank stability (Kendall tau across seeds, architectures and weights)
    and the plots (radar, accuracy against IPC, training loss, confusion matrices), where there is data
    for them. ``plots=False``: no figure is drawn (``summary --no-log`` prints tables only)."""
    boards = load_boards(w, gamma, alpha)
    weights = {"w": f"w = {w}", "gamma": f"gamma = {gamma}", "alpha": f"alpha = {alpha}"}
    sections = []
    for spec in all_specs():  # every protocol's boards, from its spec, in report order
        for board_spec in spec.boards:
            board = boards[board_spec.name]
            if board.empty or board_spec.name in SHOWN_WITHIN:
                continue
            weight = f" ({weights[board_spec.weight]})" if board_spec.weight in weights else ""
            title = TITLES.get(board_spec.name, f"{board_spec.title}{weight}")
            section = Section(title.format(weight=weight), {board_spec.name: board})
            _extras(section, board_spec.name, board, boards, plots)
            sections.append(section)
        if spec.name == "augmentation_robust":  # imported rows beside DD-Ranking's boards
            from ddlib.report.published import published_table

            published = published_table()
            if not published.empty:
                sections.append(Section("Published rows (ddlib import): as published, not measured here, never "
                                        "pooled with the rows above", {"published": published}))
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
