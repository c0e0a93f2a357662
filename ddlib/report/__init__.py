"""Leaderboards built from MLflow, one module per benchmark: :mod:`.ddranking` (LRS, ARS),
:mod:`.beard` (RR, AE, CREI, RCR), :mod:`.dcbench` (augmentation, compression, transfer, NAS);
:mod:`.core` reads per-seed values out of MLflow and formats and logs tables."""

from ddlib.report.beard import eps_curves, plot_eps_curves, robustness_leaderboard, unified_leaderboard
from ddlib.report.core import aggregate, format_leaderboard, log_summary, per_seed_values
from ddlib.report.dcbench import (augmentation_leaderboard, compression_leaderboard, nas_leaderboard,
                                   plot_compression, synthesis_vs_selection, transfer_leaderboard, transfer_tau)
from ddlib.report.ddranking import ROW_PARAMS, SWEEP, ars_leaderboard, lrs_leaderboard, plot_scores, weight_sweep

__all__ = [
    "per_seed_values", "aggregate", "format_leaderboard", "log_summary",
    "ROW_PARAMS", "SWEEP", "lrs_leaderboard", "ars_leaderboard", "weight_sweep", "plot_scores",
    "robustness_leaderboard", "unified_leaderboard", "eps_curves", "plot_eps_curves",
    "augmentation_leaderboard", "compression_leaderboard", "plot_compression", "synthesis_vs_selection",
    "transfer_leaderboard", "transfer_tau", "nas_leaderboard",
]
