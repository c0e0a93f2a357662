"""The reports on top of the leaderboards: the summary (:mod:`.report`), report cards (:mod:`.card`), the
static site (:mod:`.site`), exports and bundles, plots. May import every package below it (protocols/, boards/, ...).

The boards are the protocols' (each spec names its builders: ``ddlib.protocols.*_boards``, privacy's in
its module); :mod:`ddlib.boards` reads per-seed values out of MLflow, aggregates, ranks and formats.
The names below load their module on first use (PEP 562), so ``ddlib.report.export`` or the command
line does not import the attack stack (torchattacks, the engine) that the BEARD boards need."""

from __future__ import annotations

import importlib

_HOME = {
    "per_seed_values": "ddlib.boards.read", "aggregate": "ddlib.boards.rank",
    "format_leaderboard": "ddlib.boards.table", "log_summary": "ddlib.boards.table",
    "ROW_PARAMS": "ddlib.protocols.ddranking_boards", "SWEEP": "ddlib.protocols.ddranking_boards",
    "lrs_leaderboard": "ddlib.protocols.ddranking_boards", "ars_leaderboard": "ddlib.protocols.ddranking_boards",
    "weight_sweep": "ddlib.protocols.ddranking_boards", "plot_scores": "ddlib.protocols.ddranking_boards",
    "robustness_leaderboard": "ddlib.protocols.beard_boards", "unified_leaderboard": "ddlib.protocols.beard_boards",
    "eps_curves": "ddlib.protocols.beard_boards", "plot_eps_curves": "ddlib.protocols.beard_boards",
    "augmentation_leaderboard": "ddlib.protocols.dcbench_boards",
    "compression_leaderboard": "ddlib.protocols.dcbench_boards", "plot_compression": "ddlib.protocols.dcbench_boards",
    "synthesis_vs_selection": "ddlib.protocols.dcbench_boards", "transfer_leaderboard": "ddlib.protocols.dcbench_boards",
    "transfer_tau": "ddlib.protocols.dcbench_boards", "nas_leaderboard": "ddlib.protocols.dcbench_boards",
}
__all__ = list(_HOME)


def __getattr__(name: str):
    if name in _HOME:
        value = getattr(importlib.import_module(_HOME[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ddlib.report' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])
