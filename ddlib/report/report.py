"""Every leaderboard that has runs, as one report: what ``python -m ddlib summary`` prints and logs."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ddlib.boards.rank import INTERVALS
from ddlib.boards.table import format_leaderboard
from ddlib.protocols.spec import all_specs
from ddlib.report.boards import load_boards, one_read, spec_function
from ddlib.report.plots import summary_figures
from ddlib.report.stability import stability_table
from ddlib.scores.stats import describe_method

__all__ = ["Section", "build_report", "shown", "RANK_NOTE"]

RANK_NOTE = (f"rank: 1 + the methods significantly better in the same setting (paired by seed, 95 % bootstrap "
             f"interval of the difference excludes 0): equal ranks and 'tied with' are not significantly different; "
             f"{describe_method(**INTERVALS)}")


@dataclass
class Section:
    """One titled part of the summary: its tables (CSV and formatted HTML) and figures."""

    title: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # name -> raw table (CSV); mean/std ones are formatted
    figures: dict = field(default_factory=dict)
    caption: str = ""


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
            if board.empty or not board_spec.own_section:
                continue
            weight = f" ({weights[board_spec.weight]})" if board_spec.weight in weights else ""
            title = (board_spec.heading or f"{board_spec.title}{{weight}}").format(weight=weight)
            section = Section(title, {board_spec.name: board})
            if board_spec.section:  # what the protocol shows beside the board (sweeps, derived tables, plots)
                tables, figures = spec_function(board_spec.section)(board_spec.name, board, boards, plots)
                section.tables.update(tables)
                section.figures.update(figures)
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
