"""Every leaderboard, read from MLflow once: what the summary, the report cards and the site share.

The boards are the protocols' (each protocol's spec lists its boards and the function that builds
each, :class:`ddlib.protocols.spec.Board`); beside them two derived tables: BEARD's robust accuracy
against epsilon (``eps_curves``) and DC-Bench's ranking across architectures (``transfer_tau``)."""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from typing import Iterator

import pandas as pd

from ddlib.protocols.spec import board_specs
from ddlib.report.core import reading_from
from ddlib.store.tracking import tracking_uri

__all__ = ["Boards", "load_boards", "build_board", "one_read"]

_BUILT: dict | None = None  # inside one_read(): (board, weight, store) -> the board as built


@contextlib.contextmanager
def one_read() -> Iterator[None]:
    """Inside it, each board is built once per score weight: a summary builds the LRS board at the five
    sweep weights for its sweep table, again for the rank stability table, and at w = 0.5 for the board
    itself (each build reads MLflow and bootstraps the ranks). A board built after the block is read
    from MLflow afresh."""
    global _BUILT
    outer = _BUILT
    _BUILT = {} if outer is None else outer
    try:
        yield
    finally:
        _BUILT = outer


@dataclass
class Boards:
    """Every leaderboard a card reads (each read from MLflow once, however many cards are built)."""

    w: float = 0.5
    gamma: float = 0.5
    alpha: float = 0.5
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables.get(name, pd.DataFrame())


def build_board(name: str, **weights: float) -> pd.DataFrame:
    """One protocol board by name, at the score weights given (``w``, ``gamma``, ``alpha``)."""
    _, board = board_specs()[name]
    module, _, function = board.build.partition(":")
    build = getattr(importlib.import_module(module), function)
    kwargs = {board.weight: weights[board.weight]} if board.weight in weights else {}
    if _BUILT is None:
        return build(**kwargs)
    key = (name, tuple(kwargs.items()), tracking_uri(), reading_from())
    if key not in _BUILT:
        _BUILT[key] = build(**kwargs)
    return _BUILT[key].copy()  # callers add columns to what they get


def load_boards(w: float = 0.5, gamma: float = 0.5, alpha: float = 0.5) -> Boards:
    """The leaderboards at these score weights (``eps_curves``: BEARD's robust accuracy against epsilon;
    ``transfer_tau``: DC-Bench's ranking across architectures), empty frames where nothing ran."""
    from ddlib.report import beard, dcbench

    weights = {"w": w, "gamma": gamma, "alpha": alpha}
    tables = {name: build_board(name, **weights) for name in board_specs()}
    tables["eps_curves"] = beard.eps_curves()
    if not tables.get("transfer", pd.DataFrame()).empty:
        tables["transfer_tau"] = dcbench.transfer_tau(tables["transfer"])
    return Boards(w, gamma, alpha, tables)
