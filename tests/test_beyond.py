"""Evaluation beyond accuracy (issue 27): calibration, class-wise fairness, compute cost, datasets in MLflow.

Every expected value below is worked by hand (in the comments), never recomputed with the code under test."""

import math

import pytest
import torch
import torch.nn as nn

from ddlib.scores import beyond_accuracy as beyond

from ddlib.store import tracking
from ddlib.engine.test_pass import _test_counts

# Six test images, two classes; the model's confidence in its predicted class, and whether it is right:
#   a 0.95 right, b 0.95 wrong, c 0.70 right, d 0.70 right, e 0.81 right, f 0.89 wrong.
# 15 equal-width bins ((m-1)/15, m/15]: 0.95 -> bin 14 (0.933, 1], 0.70 -> bin 10 (0.667, 0.733],
# 0.81 -> bin 12 (0.8, 0.867], 0.89 -> bin 13 (0.867, 0.933]. Per bin |correct - sum of confidences|:
#   bin 14: |1 - 1.90| = 0.90; bin 10: |2 - 1.40| = 0.60; bin 12: |1 - 0.81| = 0.19; bin 13: |0 - 0.89| = 0.89
#   ECE = (0.90 + 0.60 + 0.19 + 0.89) / 6 = 2.58 / 6 = 0.43
# (10 bins would put e and f in one bin (0.8, 0.9]: |1 - 1.70| = 0.70, ECE (0.9 + 0.6 + 0.7) / 6 = 0.3667;
#  one bin: |4 - 5.20| / 6 = 0.20; the true class's probability as confidence: another number again.)
# NLL = mean of -ln p(true class): -ln .95 = 0.051293, -ln .05 = 2.995732, -ln .70 = 0.356675 (twice),
#   -ln .81 = 0.210721, -ln .11 = 2.207275; sum 6.178371, mean 1.029729.
CONFIDENCE = [0.95, 0.95, 0.70, 0.70, 0.81, 0.89]
RIGHT = [True, False, True, True, True, False]
LABELS = torch.tensor([1, 0, 1, 0, 1, 0])
ECE, NLL = 0.43, 1.029729


def _logits() -> torch.Tensor:
    """Two-class logits whose softmax gives the confidences above, predicting the label where RIGHT."""
    rows = []
    for p, right, label in zip(CONFIDENCE, RIGHT, LABELS.tolist()):
        predicted = label if right else 1 - label
        row = [0.0, 0.0]
        row[predicted] = math.log(p / (1 - p))
        rows.append(row)
    return torch.tensor(rows)


def _pass(forward, models=1):
    x = torch.zeros(6, 1)
    return _test_counts(forward, x, LABELS, 2, 4, torch.device("cpu"), "fp32", ("probe", models))


def test_ece_and_nll_on_a_hand_worked_reliability_table():
    logits = _logits()
    confusion, sums = _pass(_chunked(logits))
    assert confusion.trace().item() == 4  # the accuracy is unchanged: 4 of 6 right
    scores = beyond.calibration(sums[0].tolist())
    assert scores["ece"] == pytest.approx(ECE, abs=1e-6)
    assert scores["nll"] == pytest.approx(NLL, abs=1e-5)
    table = beyond.reliability_table(sums[0].tolist())
    assert [b["images"] for b in table] == [0] * 10 + [2, 0, 1, 1, 2]
    assert table[14]["accuracy"] == 0.5 and table[14]["confidence"] == pytest.approx(0.95)


def _chunked(logits):
    """A forward that serves the chunks of the test pass in order (batch 4: images 0-3, then 4-5)."""
    state = {"at": 0}

    def forward(x):
        out = logits[..., state["at"]: state["at"] + x.shape[0], :]
        state["at"] += x.shape[0]
        return out
    return forward


def test_ece_per_model_when_the_pass_scores_several_models_at_once():
    one = _logits()
    # model 2: every prediction at confidence 0.70 and right: ECE |6 - 4.2| / 6 = 0.30
    two = torch.tensor([[0.0, math.log(0.7 / 0.3)] if y == 1 else [math.log(0.7 / 0.3), 0.0] for y in LABELS.tolist()])
    confusion, sums = _pass(_chunked(torch.stack([one, two])), models=2)
    assert confusion[0].trace().item() == 4 and confusion[1].trace().item() == 6
    assert beyond.calibration(sums[0].tolist())["ece"] == pytest.approx(ECE, abs=1e-6)
    assert beyond.calibration(sums[1].tolist())["ece"] == pytest.approx(0.30, abs=1e-6)


def test_worst_class_and_spread_on_a_known_confusion_matrix():
    # per-class accuracies 8/10 = 0.8, 4/10 = 0.4, 10/10 = 1.0: worst 0.4, range 0.6;
    # mean 0.7333, deviations 0.0667, -0.3333, 0.2667, squares 0.004444 + 0.111111 + 0.071111 = 0.186667,
    # population std sqrt(0.186667 / 3) = 0.249444; a class without test images (the 4th) is left out
    confusion = [[8, 2, 0, 0], [1, 4, 5, 0], [0, 0, 10, 0], [0, 0, 0, 0]]
    fair = beyond.class_fairness(confusion)
    assert fair["worst_class_acc"] == pytest.approx(0.4)
    assert fair["class_acc_range"] == pytest.approx(0.6)
    assert fair["class_acc_std"] == pytest.approx(0.249444, abs=1e-6)


def test_flops_of_small_models_known_analytically():
    # Linear 12 -> 5 on a 3x2x2 image: 12 x 5 multiply-adds = 120 FLOPs (2 per multiply-add; bias not counted)
    linear = beyond.flops_per_image(lambda: nn.Sequential(nn.Flatten(), nn.Linear(12, 5)), (3, 2, 2))
    assert linear == 120
    # Conv 3 -> 4, 3x3, same padding, on 8x8: 2 x (3 x 9) x 4 x 64 = 13824 FLOPs
    conv = beyond.flops_per_image(lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()), (3, 8, 8))
    assert conv == 13824
    # 10 training images, 2 epochs, batch 4, 7 test images: 20 images seen in 3 x 2 = 6 steps,
    # training 3 x 120 x 20 = 7200 FLOPs, testing 120 x 7 = 840
    cost = beyond.training_cost(120, 10, 2, 4, 7)
    assert cost == {"train_flops": 7200, "test_flops": 840, "train_images": 20, "test_images": 7, "train_steps": 6}


def test_an_evaluation_logs_its_scores_cost_and_datasets(mlflow_store):
    from ddlib.data.digest import tensor_digest
    from ddlib.engine.train import Recipe
    from ddlib.protocols.cell import Cell

    cell = Cell.open("pool", {"dataset": "digits", "model": "mlp", "seeds": [0], "device": "cpu", "test_size": 100},
                     experiment="beyond", progress=False)
    ds = cell.dataset
    x, y = ds.train_images[:40], ds.train_labels[:40]
    (trained,) = cell.train_eval("syn", x, y, Recipe(epochs=1, batch_size=16), [0])
    client = tracking.client()
    run = client.get_run(trained.run_id)
    m = run.data.metrics
    assert math.isfinite(m["ece"]) and math.isfinite(m["nll"])  # logged per model (their values: by hand, above)
    # the mlp's FLOPs per image come from its layers; 40 images x 1 epoch = 40 seen in ceil(40 / 16) = 3 steps
    assert m["train_images"] == 40 and m["train_steps"] == 3 and m["test_images"] == 100
    assert m["train_flops"] == 3 * m["flops_per_image"] * 40 and m["flops_per_image"] > 0
    inputs = {i.tags[0].value: i.dataset for i in run.inputs.dataset_inputs}
    assert set(inputs) == {"distilled", "test"}
    assert inputs["distilled"].digest == tensor_digest(x, y)
    assert inputs["test"].digest == tensor_digest(ds.test_images, ds.test_labels)
    assert "reliability.json" in {f.path for f in client.list_artifacts(trained.run_id)}
    (again,) = cell.train_eval("syn", x, y, Recipe(epochs=1, batch_size=16), [0])
    assert again.reused
    cell.close()
    parent = client.get_run(cell.run_id)
    assert parent.data.metrics["ece.syn_mean"] == pytest.approx(m["ece"])  # the two uses of one model
    assert parent.data.metrics["cost.train_flops_mean"] == pytest.approx(2 * m["train_flops"])
    assert {i.tags[0].value for i in parent.inputs.dataset_inputs} == {"distilled", "test"}
    assert "reliability.png" in {f.path for f in client.list_artifacts(cell.run_id)}


def _lrs_cell(method: str, rows: list[dict]) -> str:
    """A FINISHED label_robust cell run with per-seed histories, as a cell logs them."""
    from ddlib.protocols import label_robust
    from ddlib.protocols.cell import cell_tags
    from ddlib.store.tracking import Tracker, default_tags

    params = label_robust.validate({"dataset": "digits", "method": method, "ipc": 2, "seeds": [0, 1]})
    tracker = Tracker("label_robust")
    run_id = tracker.start_run(method, params=params, tags={**default_tags("label_robust"),
                                                            **cell_tags("label_robust", params)})
    tracker.log_per_seed(run_id, rows)
    tracker.end_run(run_id)
    return run_id


def test_the_lrs_board_shows_the_distilled_sides_scores_and_the_cells_cost(mlflow_store):
    from ddlib.protocols.ddranking_boards import lrs_leaderboard

    accuracies = {"acc_syn_hard": 0.5, "acc_real_hard": 0.9, "acc_syn_any": 0.6, "acc_rdm_any": 0.4}
    # dm: syn_any's ECE 0.10 and 0.20 over seeds 0, 1 -> mean 0.15; syn_hard's (0.9) is not the board's;
    # syn_any's training FLOPs 1e12 and 3e12 -> mean 2e12 (the cell's, with its reference, are not the board's)
    _lrs_cell("dm", [{"seed": s, **accuracies, "ece.syn_any": e, "ece.syn_hard": 0.9, "worst_class_acc.syn_any": w,
                      "cost.train_flops.syn_any": f, "cost.train_flops": 50 * f}
                     for s, e, w, f in ((0, 0.1, 0.3, 1e12), (1, 0.2, 0.5, 3e12))])
    _lrs_cell("random", [{"seed": s, **accuracies} for s in (0, 1)])  # logged before these columns: NaN
    board = lrs_leaderboard().set_index("method")
    assert board.loc["dm", "ece_mean"] == pytest.approx(0.15)
    assert board.loc["dm", "worst_class_acc_mean"] == pytest.approx(0.4)
    assert board.loc["dm", "train_flops_mean"] == pytest.approx(2e12)
    assert math.isnan(board.loc["random", "ece_mean"]) and math.isnan(board.loc["random", "train_flops_mean"])
    assert board.loc["dm", "lrs_mean"] == board.loc["random", "lrs_mean"]  # the score is untouched


def test_system_metrics_are_mlflows_own_switch(mlflow_store, monkeypatch):
    from waiting import BOUND_SECONDS, wait_for

    from ddlib.protocols.cell import Cell

    params = {"dataset": "digits", "model": "mlp", "seeds": [0], "device": "cpu", "test_size": 20}
    off = Cell.open("pool", dict(params), experiment="beyond", progress=False)
    off.close()
    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "true")
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "1")
    on = Cell.open("pool", dict(params), experiment="beyond", progress=False)
    client = tracking.client()
    try:  # MLflow's sampling thread logs a sample a second: wait until one is there, not for a while
        wait_for(lambda: any(k.startswith("system/cpu") for k in client.get_run(on.run_id).data.metrics),
                 BOUND_SECONDS, "a system metric of the run", every=0.5)
    finally:
        on.close()
    assert not any(k.startswith("system/") for k in client.get_run(off.run_id).data.metrics)


def test_board_columns_take_each_rows_own_role():
    """A board mixing a soft-label cell (its headline accuracy is ``syn_any``) and a hard-label one
    (``syn_hard`` only): each row shows its own role's ECE, not NaN for the hard one."""
    import pandas as pd

    from ddlib.protocols.beyond import board_columns

    df = pd.DataFrame({"ece.syn_any": [0.2, float("nan")], "ece.syn_hard": [0.3, 0.1]})
    board_columns(df, ("syn_any", "syn_hard"))
    assert df["ece"].tolist() == [0.2, 0.1]


def test_board_cost_is_the_headline_models_not_the_cells_references():
    """The LRS board's train_flops is what the set's models cost (``cost.train_flops.syn_hard``), not
    the cell's total, which holds the full-data reference (100 x more here)."""
    import pandas as pd

    from ddlib.protocols.beyond import board_columns

    df = pd.DataFrame({"cost.train_flops": [101.0], "cost.train_flops.syn_hard": [1.0],
                       "cost.train_flops.real_hard": [100.0]})
    board_columns(df, ("syn_any", "syn_hard"))
    assert df["train_flops"].tolist() == [1.0]


def test_a_shadow_models_real_draw_is_not_named_the_distilled_set():
    """The privacy protocol's shadow models train on real draws (roles shadow_ipc, shadow_full): their
    MLflow dataset context is "shadow", not "distilled" (which would list them as the method's set)."""
    from types import SimpleNamespace

    import torch

    from ddlib.protocols.beyond import context_of

    data = SimpleNamespace(train_labels=torch.zeros(300))
    cell = SimpleNamespace(dataset=data, unsplit=None)
    assert context_of(cell, "shadow_ipc", torch.zeros(20)) == "shadow"
    assert context_of(cell, "syn_hard", torch.zeros(20)) == "distilled"
    assert context_of(cell, "rdm_hard", torch.zeros(20)) == "random"
    assert context_of(cell, "real_hard", torch.zeros(300)) == "train"
