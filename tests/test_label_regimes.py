"""Label regimes at matched compute (issue 57): the board's verdict worked by hand, regimes that cannot
apply say why and train nothing, every regime and both sets see as many images, a digits cell end to
end through the runner's steps and onto the board, and the notebook is its spec's."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

TINY = {"dataset": "digits", "ipc": 1, "seeds": [0, 1], "device": "cpu", "recipe": {"epochs": 2, "batch_size": 32},
        "augment": [{"random_resized_crop": {"scale": [0.8, 1.0]}}]}


def test_the_verdict_worked_by_hand():
    """Four seeds. hl: the set beats its random subset at every seed (gaps 10, 11, 9, 9 points), so every
    paired resample's mean gap is at least 9 points: +9.75 points, significant. sl: gaps +1, -2, +1, +1
    points (mean +0.25); a resample drawing seed 1 twice of four (probability 0.26 > 2.5 %) has a negative
    mean, so the interval holds 0: no significant gap. sl_kd: no teacher, so no numbers, only the reason."""
    from ddlib.protocols.label_regimes import verdicts

    per_seed = pd.DataFrame({"seed": [0, 1, 2, 3],
                             "acc_syn_hl": [0.80, 0.82, 0.78, 0.81], "acc_rdm_hl": [0.70, 0.71, 0.69, 0.72],
                             "acc_syn_sl": [0.85, 0.83, 0.86, 0.84], "acc_rdm_sl": [0.84, 0.85, 0.85, 0.83]})
    why = {"sl_kd": "not applicable: no teacher is given to relabel every augmented batch"}
    out = verdicts(per_seed, why)
    assert out["verdict_hl"].startswith("beats random: +9.75 points, 95% [+9")
    low = float(out["verdict_hl"].split("[")[1].split(",")[0])
    assert 9.0 <= low <= 9.75
    assert out["verdict_sl"].startswith("no significant gap: +0.25 points, 95% [-")
    assert out["verdict_sl_kd"] == why["sl_kd"]
    assert out["beats_random_in"] == "hl only"
    below = verdicts(per_seed.assign(acc_syn_hl=per_seed.acc_rdm_hl - 0.05))
    assert below["verdict_hl"].startswith("below random: -5.00 points") and below["beats_random_in"] == "none"
    assert below["verdict_sl_kd"] == "not run"


def test_which_regimes_apply():
    from ddlib.data.distilled import DistilledSet
    from ddlib.protocols.label_regimes import matched_epochs, not_applicable
    from ddlib.engine.recipe import Recipe

    hard = DistilledSet(images=torch.zeros(2, 1, 8, 8), labels=torch.tensor([0, 1]), num_classes=2)
    soft = DistilledSet(images=torch.zeros(2, 1, 8, 8), labels=torch.tensor([0, 1]), num_classes=2,
                        soft_labels=torch.eye(2))
    assert not_applicable("hl", hard, ()) == ""
    assert not_applicable("sl", hard, ()).startswith("not applicable: the set ships no soft labels")
    assert not_applicable("sl", soft, ()).startswith("not applicable: the random subset has no soft labels")
    assert not_applicable("sl_kd", soft, ()).startswith("not applicable: no teacher")
    assert all(not_applicable(r, s, ("convnet",)) == "" for r in ("hl", "sl", "sl_kd") for s in (hard, soft))
    # a set with unequal classes (fewer images than its random subset): the subset trains fewer epochs
    recipe = Recipe.from_dict({"epochs": 30})
    assert matched_epochs(recipe, 100, 100) == 30 and matched_epochs(recipe, 90, 100) == 27


@pytest.mark.parametrize("bad", [{"regimes": ["hl", "kd"]}, {"regimes": []}, {"teacher": "nope"},
                                 {"temperature": 0}, {"soft_loss": "nope"}, {"teacher": "convnet",
                                                                             "teacher_checkpoints": ["a", "b"]}])
def test_bad_params_are_refused_naming_the_key(bad):
    from ddlib.protocols.label_regimes import validate

    with pytest.raises(ValueError):
        validate({**TINY, **bad})


def test_without_a_teacher_only_hard_labels_train_and_the_rest_say_why(mlflow_store, monkeypatch, tmp_path):
    from ddlib.protocols import label_regimes
    from ddlib.store import tracking

    monkeypatch.setenv("DDLIB_CACHE", str(tmp_path))
    cell = label_regimes.open_cell(**TINY)
    result = label_regimes.evaluate(cell, label_regimes.obtain(cell))
    cell.close()
    assert sorted(c for c in result.per_seed if c != "seed") == ["acc_rdm_hl", "acc_syn_hl", "gap_hl"]
    assert set(cell.cache["trainings"]) == {"syn_hl", "rdm_hl"}
    tags = tracking.client().get_run(result.run_id).data.tags
    assert tags["ddlib.label_regimes.hl"].startswith("applies")
    assert tags["ddlib.label_regimes.sl"].startswith("not applicable: the set ships no soft labels")
    assert tags["ddlib.label_regimes.sl_kd"].startswith("not applicable: no teacher")
    assert result.regimes.loc["sl_kd", "labels"] == tags["ddlib.label_regimes.sl_kd"]


@pytest.mark.slow
def test_a_digits_cell_end_to_end_at_one_budget_and_on_the_board(mlflow_store, monkeypatch, tmp_path):
    """Through the runner's steps: every regime and both sets train the same images seen (the cell's
    training counts), the per-seed values are logged in shown units, and the board gives the verdicts."""
    from ddlib.protocols import label_regimes
    from ddlib.protocols.label_regimes import regimes_leaderboard
    from ddlib.scoring import _run_steps, resolve_cell

    monkeypatch.setenv("DDLIB_CACHE", str(tmp_path))
    params = {**TINY, "teacher": "convnet", "teacher_recipe": {"epochs": 2}, "temperature": 1.0}
    grid = {"protocol": "label_regimes", "params": params, "grid": {"method": ["kcenter"], "ipc": [1]}, "methods": {}}
    protocol, experiment, cell_params = resolve_cell(grid)
    result = _run_steps(protocol, experiment, cell_params, progress=False)
    for regime in ("hl", "sl", "sl_kd"):
        assert not math.isnan(result.summary[f"gap_{regime}_mean"])
        gap = result.per_seed[f"acc_syn_{regime}"] - result.per_seed[f"acc_rdm_{regime}"]
        assert (gap - result.per_seed[f"gap_{regime}"]).abs().max() < 1e-6  # % minus % is points
    seen = result.regimes[["side", "images_seen"]]
    assert set(seen["side"]) == {"syn", "rdm"} and seen["images_seen"].nunique() == 1  # 10 images x 2 epochs
    assert int(seen["images_seen"].iloc[0]) == 20

    # the cell's own training counts: every role, as many images seen per model
    cell = label_regimes.open_cell(**cell_params)
    result = label_regimes.evaluate(cell, label_regimes.obtain(cell))  # reused from the store: nothing trains
    cell.close()
    counts = cell.cache["trainings"]
    assert set(counts) == {f"{side}_{r}" for side in ("syn", "rdm") for r in ("hl", "sl", "sl_kd")}
    assert {c["image_epochs"] / c["models"] for c in counts.values()} == {20}
    assert all(c["trained"] == 0 for c in counts.values())  # keyed by tensors, recipe, loss, teacher: reused

    board = regimes_leaderboard()
    (row,) = board.to_dict("records")
    assert row["method"] == "kcenter" and row["seeds"] == 2
    assert {f"verdict_{r}" for r in ("hl", "sl", "sl_kd")} <= set(row) and row["beats_random_in"]
    assert abs(row["gap_hl_mean"] - (row["acc_syn_hl_mean"] - row["acc_rdm_hl_mean"])) < 1e-9


def test_the_notebook_is_the_spec():
    import json
    from pathlib import Path

    from ddlib.protocols.spec import get_spec, parameters_source

    spec = get_spec("label_regimes")
    nb = json.loads((Path(__file__).resolve().parents[1] / "notebooks" / spec.notebook).read_text())
    (cell,) = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert "".join(cell["source"]) == parameters_source(spec)
    assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")


def test_the_dry_runs_work_model_counts_what_a_cell_trains():
    from ddlib.protocols.label_regimes import validate
    from ddlib.run.work import Training, cell_work

    def models(**params):
        work = cell_work("label_regimes", validate({**TINY, **params}))
        return {w.stem: (w.models, w.images * w.epochs) for w in work if isinstance(w, Training)}

    assert models() == {"syn_hl": (2, 20), "rdm_hl": (2, 20)}  # no teacher: sl and sl_kd train nothing
    taught = models(teacher="convnet", teacher_recipe={"epochs": 2})
    assert {k: v for k, v in taught.items() if not k.startswith("teacher")} == {
        f"{side}_{r}": (2, 20) for side in ("syn", "rdm") for r in ("hl", "sl", "sl_kd")}
    assert "teacher convnet (seed 0)" in taught
    assert "teacher convnet (seed 0)" not in models(teacher="convnet", regimes=["hl"])
