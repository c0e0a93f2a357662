"""Leaderboards built from MLflow, one module per benchmark: :mod:`.ddranking` (LRS, ARS),
:mod:`.beard` (RR, AE, CREI, RCR), :mod:`.dcbench` (augmentation, compression, transfer, NAS);
:mod:`.core` reads per-seed values out of MLflow and formats and logs tables.

The names below load their module on first use (PEP 562), so ``ddlib.report.export`` or the command
line does not import the attack stack (torchattacks, the engine) that :mod:`.beard` needs."""

from __future__ import annotations

import importlib

_HOME = {
    "per_seed_values": "core", "aggregate": "core", "format_leaderboard": "core", "log_summary": "core",
    "ROW_PARAMS": "ddranking", "SWEEP": "ddranking", "lrs_leaderboard": "ddranking", "ars_leaderboard": "ddranking",
    "weight_sweep": "ddranking", "plot_scores": "ddranking",
    "robustness_leaderboard": "beard", "unified_leaderboard": "beard", "eps_curves": "beard",
    "plot_eps_curves": "beard",
    "augmentation_leaderboard": "dcbench", "compression_leaderboard": "dcbench", "plot_compression": "dcbench",
    "synthesis_vs_selection": "dcbench", "transfer_leaderboard": "dcbench", "transfer_tau": "dcbench",
    "nas_leaderboard": "dcbench",
}
__all__ = list(_HOME)


def __getattr__(name: str):
    if name in _HOME:
        value = getattr(importlib.import_module(f"ddlib.report.{_HOME[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ddlib.report' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])
