"""Every leaderboard, read from MLflow once: what the summary, the report cards and the site share.

The boards are the protocols' (each protocol's spec lists its boards and the function that builds
each, :class:`ddlib.protocols.spec.Board`); beside them the tables a board's spec derives from it
(``derived``: BEARD's robust accuracy against epsilon, ``eps_curves``; DC-Bench's ranking across
architectures, ``transfer_tau``)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import pandas as pd

from ddlib.protocols.spec import board_specs
from ddlib.boards.read import one_read, read_once
from ddlib.report.published import with_verified

__all__ = ["Boards", "load_boards", "build_board", "one_read", "spec_function"]

@dataclass
class Boards:
    """Every leaderboard a card reads (each read from MLflow once, however many cards are built)."""

    w: float = 0.5
    gamma: float = 0.5
    alpha: float = 0.5
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables.get(name, pd.DataFrame())


def spec_function(path: str):
    """The function a board's spec names as ``"module:function"`` (its build, section, derived tables)."""
    module, _, function = path.partition(":")
    return getattr(importlib.import_module(module), function)


def build_board(name: str, **weights: float) -> pd.DataFrame:
    """One protocol board by name, at the score weights given (``w``, ``gamma``, ``alpha``); rows whose method
    has a published value (``ddlib import``) carry ``verified`` (:func:`ddlib.report.published.with_verified`)."""
    _, board = board_specs()[name]
    build = spec_function(board.build)
    kwargs = {board.weight: weights[board.weight]} if board.weight in weights else {}
    return with_verified(read_once(name, kwargs, lambda: build(**kwargs)))


def load_boards(w: float = 0.5, gamma: float = 0.5, alpha: float = 0.5) -> Boards:
    """The leaderboards at these score weights, then the tables their specs derive from them
    (``eps_curves``: BEARD's robust accuracy against epsilon; ``transfer_tau``: DC-Bench's ranking
    across architectures), empty frames where nothing ran."""
    weights = {"w": w, "gamma": gamma, "alpha": alpha}
    specs = board_specs()
    tables = {name: build_board(name, **weights) for name in specs}
    for name, (_, board) in specs.items():
        for table, derive in board.derived:
            tables[table] = spec_function(derive)(tables[name])
    return Boards(w, gamma, alpha, tables)
