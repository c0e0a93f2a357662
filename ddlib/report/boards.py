"""Every leaderboard, read from MLflow once: what the summary, the report cards and the site share."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ddlib.report import beard, dcbench, ddranking

__all__ = ["Boards", "load_boards"]


@dataclass
class Boards:
    """Every leaderboard a card reads (each read from MLflow once, however many cards are built)."""

    w: float = 0.5
    gamma: float = 0.5
    alpha: float = 0.5
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables.get(name, pd.DataFrame())


def load_boards(w: float = 0.5, gamma: float = 0.5, alpha: float = 0.5) -> Boards:
    """The leaderboards at these score weights (``eps_curves``: BEARD's robust accuracy against epsilon;
    ``transfer_tau``: DC-Bench's ranking across architectures), empty frames where nothing ran."""
    tables = {
        "lrs": ddranking.lrs_leaderboard(w=w),
        "ars": ddranking.ars_leaderboard(gamma=gamma),
        "beard": beard.robustness_leaderboard(alpha=alpha),
        "beard_unified": beard.unified_leaderboard(alpha=alpha),
        "eps_curves": beard.eps_curves(),
        "augmentation": dcbench.augmentation_leaderboard(),
        "transfer": dcbench.transfer_leaderboard(),
        "compression": dcbench.compression_leaderboard(),
        "nas": dcbench.nas_leaderboard(),
    }
    if not tables["transfer"].empty:
        tables["transfer_tau"] = dcbench.transfer_tau(tables["transfer"])
    return Boards(w, gamma, alpha, tables)
