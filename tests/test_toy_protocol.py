"""Adding a protocol is one module, its notebook and a params file (issue 23): a toy protocol kept
outside ddlib (tests/toy_protocol/) runs through the batch runner (papermill, MLflow), and its
leaderboard, the report card, the site's boards, rank stability and the notebook's parameters all
come from its spec, with no change to ddlib."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TOY = Path(__file__).resolve().parent / "toy_protocol"


@pytest.fixture
def toy(monkeypatch):
    from ddlib.protocols.spec import PATH_ENV

    monkeypatch.setenv(PATH_ENV, str(TOY))
    yield TOY


def test_a_toy_protocol_is_found_from_its_own_folder(toy):
    from ddlib.protocols import PROTOCOLS
    from ddlib.protocols.spec import get_spec, parameters_source
    from ddlib.scoring import set_protocols

    assert "toy" in PROTOCOLS and "toy" in set_protocols()
    spec = get_spec("toy")
    nb = json.loads((toy / "toy.ipynb").read_text())
    (cell,) = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert "".join(cell["source"]) == parameters_source(spec)  # its notebook's parameters are its spec's


@pytest.mark.slow
def test_a_toy_protocol_runs_end_to_end_and_fills_its_board(toy, mlflow_store, monkeypatch):
    """`ddlib run` on the toy's params file runs its two cells through papermill, and its board, the
    report card and rank stability come from its spec. Why it takes about 12 s: a fresh store, the
    runner's spawned worker and two papermill kernels (random and K-Center at IPC 2), each importing
    torch, ddlib and MLflow, which is most of the time, before the cells' tiny trainings (2 seeds of 3
    epochs on 20 digits each); the runner, the notebook and the store are what a protocol added from
    outside must pass through."""
    from ddlib.cli import main as cli_main
    from ddlib.report import card as cards
    from ddlib.report.boards import load_boards
    from ddlib.report.stability import scored

    monkeypatch.chdir(toy.parents[1])
    assert cli_main(["run", str(toy / "toy.yaml")]) == 0
    boards = load_boards()
    board = boards["toy"]
    assert sorted(board["method"]) == ["kcenter", "random"] and set(board["seeds"]) == {2}
    assert {"acc_mean", "rank", "tied_with"} <= set(board.columns)  # ranked by the spec's score
    assert scored()["toy"] == "acc"
    card = cards.build_card("kcenter", "digits", 2, boards=boards)
    block = next(b for b in card.blocks if b.protocol == "toy")
    assert block.ran and block.title == "Toy: accuracy of the set"
    assert "Toy: accuracy of the set" in set(card.headline["protocol"])
