"""A protocol of one's own, in one module (with its notebook beside it and a params file): the set's
accuracy with one ConvNet per seed. ``tests/test_toy_protocol.py`` runs it through the runner, the
leaderboards and the report card without touching ddlib (``DDLIB_PROTOCOL_PATH`` names this folder)."""

from __future__ import annotations

from ddlib.data.distilled import DistilledSet
from ddlib.protocols.cell import Cell
from ddlib.protocols.common import SET_PARAMS, check_recipe, obtain, validate_set_params
from ddlib.protocols.spec import Board, Param, ProtocolSpec, Result

__all__ = ["SPEC", "validate", "open_cell", "obtain", "evaluate", "leaderboard"]

SPEC = ProtocolSpec(
    name="toy", revision=1, order=90, title="Toy: accuracy of the set",
    summary="one model per seed trained on the set, its test accuracy",
    params={**SET_PARAMS, "recipe": Param({"epochs": 2}, "Recipe keys (ddlib.engine.recipe.Recipe)")},
    boards=(Board("toy", "Toy: accuracy of the set", "ddlib_protocol_toy:leaderboard", "acc", "accuracy",
                  columns=(("acc", "test accuracy"),)),),
    headline="toy",
)


def validate(params: dict) -> dict:
    p = validate_set_params(SPEC.name, SPEC.defaults(), params)
    check_recipe(p, "recipe")
    return p


def open_cell(run_id: str | None = None, experiment: str | None = None, **params) -> Cell:
    return Cell.open(SPEC.name, validate(params), run_id=run_id, experiment=experiment)


def evaluate(cell: Cell, distilled: DistilledSet) -> Result:
    p = cell.params
    with cell.guard():
        models = cell.train_eval("set", distilled.images, distilled.labels, check_recipe(p, "recipe"), p["seeds"])
        per_seed, summary = cell.record_per_seed([{"seed": m.seed, "acc": m.accuracy} for m in models])
    return Result(per_seed=per_seed, summary=summary, protocol=cell.protocol,
                  run_id=cell.run_id)


def leaderboard(experiment: str = "toy"):
    from ddlib.boards.rank import aggregate
    from ddlib.boards.read import per_seed_values

    rows = ("dataset", "ipc", "method")
    df = per_seed_values(experiment, ("acc",), rows)
    return df if df.empty else aggregate(df, ["acc"], rows, sort=("dataset", "ipc"), descending="acc")
