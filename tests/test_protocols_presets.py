"""LRS and ARS with method presets: soft labels, teachers, augmentation, lr policy (tiny CPU settings)."""

import pytest

from ddlib import tracking

from ddlib import report
from ddlib.protocols import augmentation_robust, label_robust
from ddlib.protocols.preset_eval import evaluate_with_preset, resolve_preset
from ddlib.tracking import TAG

TINY = dict(dataset="digits", method="kcenter", source={"kind": "kcenter", "epochs": 5}, ipc=2, seeds=[0, 1],
            recipe={"epochs": 3}, real_recipe={"epochs": 1}, preset_epochs=3, teacher_recipe={"epochs": 2},
            lr_grid=[0.001, 0.01])


def _run(module, **params):
    cell = module.open_cell(**params)
    cell.progress = False
    result = module.evaluate(cell, module.obtain(cell))
    cell.close()
    return cell, result


def test_soft_label_lrs_with_teacher_and_validation_lr_search(mlflow_store):
    cell, result = _run(label_robust, **TINY, preset="sre2l")
    client = tracking.client()
    run = client.get_run(cell.run_id)
    assert run.info.status == "FINISHED"
    assert ((result.per_seed["lrs"] >= 0) & (result.per_seed["lrs"] <= 100)).all()
    # the lr was chosen on a validation split held out of the training set, for both sides alike
    assert cell.validation is not None and len(cell.validation[1]) + len(cell.dataset.train_labels) == 1347
    for role in ("syn_any", "rdm_any"):
        assert run.data.tags[f"ddlib.lr_select.{role}"].startswith("validation: chose")
        assert run.data.metrics[f"{role}_lr"] in (0.001, 0.01)
    evals = client.search_runs([run.info.experiment_id], f"tags.`{TAG['kind']}` = 'eval'")
    searched = {r.data.params["eval_split"] for r in evals if "-lr" in r.data.tags[TAG["role"]]}
    assert searched == {"val"}
    losses = {r.data.params["loss"] for r in evals if r.data.tags[TAG["role"]] in ("syn_any", "rdm_any")}
    assert len(losses) == 1 and losses.pop().startswith("relabel(1x")  # one teacher relabels both sides
    assert len(tracking.runs("teachers")) == 1  # trained once, kept in MLflow
    # same config and seed, same score (everything is reused or recomputed identically)
    _, again = _run(label_robust, **TINY, preset="sre2l")
    assert again.per_seed.equals(result.per_seed)


def test_lr_select_test_is_labelled_as_such(mlflow_store):
    cell, _ = _run(label_robust, **{**TINY, "seeds": [0]}, preset="sre2l", lr_select="test")
    tags = tracking.client().get_run(cell.run_id).data.tags
    assert "TEST set" in tags["ddlib.lr_select.syn_any"] and cell.validation is None


def test_ars_runs_with_and_without_augmentation(mlflow_store):
    cell, result = _run(augmentation_robust, **{k: v for k, v in TINY.items() if k not in ("recipe", "real_recipe")},
                        preset="dsa")
    cols = {"acc_syn_aug", "acc_rdm_aug", "acc_syn_noaug", "acc_rdm_noaug", "ior_aug", "ior_noaug", "ars"}
    assert cols <= set(result.per_seed.columns)
    assert ((result.per_seed["ars"] >= 0) & (result.per_seed["ars"] <= 100)).all()
    evals = tracking.runs("augmentation_robust", kind="eval")
    augments = dict(zip(evals["tags.ddlib.role"], evals["params.augment"]))
    assert augments["syn_noaug"] == "none" and augments["syn_aug"].startswith("dsa(")
    board = report.ars_leaderboard()
    assert list(board["method"]) == ["kcenter"] and 0 <= board.iloc[0]["ars_mean"] <= 100
    sweep = report.weight_sweep("ars")
    assert [c for c in sweep.columns if c.startswith("ars @")] == [f"ars @ {g:g}" for g in report.SWEEP]


def test_stored_soft_labels_are_used_and_random_side_gets_one_hot(mlflow_store):
    import torch

    from ddlib.methods.select import random_subset

    cell = label_robust.open_cell(**{**TINY, "seeds": [0]}, preset="datm", lr_select="none")
    cell.progress = False
    subset = random_subset(cell.dataset, 2, seed=3)
    subset.soft_labels = torch.softmax(torch.randn(len(subset), 10, generator=torch.Generator().manual_seed(0)), 1)
    preset = resolve_preset("datm")
    (with_soft,), _ = evaluate_with_preset(cell, "syn_any", subset, preset, [0], lr_select="none", epochs=2)
    subset.soft_labels = None
    (one_hot,), _ = evaluate_with_preset(cell, "rdm_any", subset, preset, [0], lr_select="none", epochs=2)
    cell.close()
    evals = tracking.runs("label_robust", kind="eval")
    losses = dict(zip(evals["tags.ddlib.role"], evals["params.loss"]))
    assert losses["syn_any"].startswith("stored:") and losses["rdm_any"].startswith("onehot:")
    assert dict(zip(evals["tags.ddlib.role"], evals["params.preprocess"]))["syn_any"].startswith("zca")


@pytest.mark.parametrize("bad,message", [
    ({"preset": "nosuchmethod"}, "preset:"),
    ({"lr_select": "best"}, "lr_select must be one of"),
    ({"lr_grid": []}, "lr_grid"),
    ({"val_fraction": 1.5}, "val_fraction"),
    ({"teacher_recipe": {"epoch": 1}}, "teacher_recipe"),
])
def test_preset_parameters_are_validated(bad, message):
    with pytest.raises(ValueError, match=message):
        label_robust.validate({**TINY, **bad})


def test_ars_needs_a_preset_with_augmentation():
    with pytest.raises(ValueError, match="needs a preset"):
        augmentation_robust.validate({"preset": None})
    with pytest.raises(ValueError, match="no augmentation"):
        augmentation_robust.validate({"preset": "dc"})
