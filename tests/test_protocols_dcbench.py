"""DC-Bench's protocols end to end on the embedded digits data: augmentation, compression, transfer, NAS."""

import pandas as pd
import pytest
import scipy.stats

from ddlib import tracking

from ddlib import report
from ddlib.protocols import augmentation, compression, nas, transfer
from ddlib.protocols.dcbench import condition_recipe

TINY = {"dataset": "digits", "seeds": [0], "device": "cpu", "recipe": {"epochs": 2, "batch_size": 64}}
ARCHS = [
    "|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|skip_connect~0|nor_conv_3x3~1|nor_conv_3x3~2|",
    "|avg_pool_3x3~0|+|nor_conv_1x1~0|skip_connect~1|+|nor_conv_1x1~0|skip_connect~1|skip_connect~2|",
    "|none~0|+|none~0|none~1|+|skip_connect~0|none~1|none~2|",
    "|nor_conv_1x1~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|none~0|nor_conv_1x1~1|avg_pool_3x3~2|",
]


# ------------------------------------------------------------------ validation before anything runs


@pytest.mark.parametrize("module,bad,message", [
    (augmentation, {"augmentations": ["none", "nope"]}, "unknown augmentation op 'nope'"),
    (augmentation, {"augmentations": ["dsa", {"dsa": {"mode": "all"}}]}, "each op may appear once"),
    (augmentation, {"augmentations": []}, "non-empty list"),
    (augmentation, {"aug_epochs": 0}, "aug_epochs must be null or a positive integer"),
    (compression, {"real_recipe": {"epoch": 3}}, "real_recipe: .*unknown recipe key"),
    (compression, {"full_data": "yes"}, "full_data must be true or false"),
    (transfer, {"models": ["mlp"]}, "must include the reference model 'convnet'"),
    (transfer, {"models": ["convnet", "resnet9000"]}, r"unknown model\(s\) \['resnet9000'\]"),
    (transfer, {"models": ["convnet"], "model_recipes": {"vit": {}}}, "model_recipes must map names in models"),
    (transfer, {"models": ["convnet"], "model_recipes": {"convnet": {"lr": -1}}}, "model_recipes.convnet"),
    (nas, {}, "ground_truth: give the path"),
    (nas, {"ground_truth": "x.csv", "num_archs": 1}, "num_archs must be at least 2"),
    (nas, {"ground_truth": "x.csv", "dataset": "digits"}, "gt_column: no ground-truth column is known"),
    (nas, {"ground_truth": "x.csv", "model": "convnet"}, r"unknown parameter\(s\) \['model'\]"),
])
def test_bad_parameters_are_refused_naming_the_key(module, bad, message):
    with pytest.raises(ValueError, match=message):
        module.validate({**({"dataset": "cifar10"} if module is nas else {}), **bad})


def test_recipe_epochs_follow_dcbench():
    p = augmentation.validate({"real_recipe": {"epochs": 7}})
    assert condition_recipe(p, None).epochs == 300  # DC-Bench without augmentation
    assert condition_recipe(p, "dsa").epochs == 1000  # and with
    assert condition_recipe(p, "dsa", full=True).epochs == 7  # the full data's overrides win
    full = augmentation.validate({"method": "full", "real_recipe": {"epochs": 7}})
    assert condition_recipe(full, None).epochs == 7  # method full trains with real_recipe


# ------------------------------------------------------------------ end to end


def test_augmentation_reports_none_mean_and_best(mlflow_store):
    cell = augmentation.open_cell(**TINY, method="random", ipc=3, aug_epochs=3,
                                  augmentations=["none", "dsa", {"flip": {"p": 1.0}}])
    result = augmentation.evaluate(cell, augmentation.obtain(cell))
    cell.close()
    row = result.per_seed.iloc[0]
    assert row.acc_noaug == row.acc_none
    assert row.acc_aug_avg == pytest.approx((row.acc_dsa + row.acc_flip) / 2)
    assert row.acc_aug_best == max(row.acc_dsa, row.acc_flip)
    evals = tracking.runs("augmentation", kind="eval")
    epochs = {r["tags.ddlib.role"]: r["params.recipe.epochs"] for _, r in evals.iterrows()}
    assert epochs == {"syn-none": "2", "syn-dsa": "3", "syn-flip": "3"}
    board = report.augmentation_leaderboard()
    assert len(board) == 1 and board.loc[0, "acc_aug_best_mean"] == row.acc_aug_best
    assert "acc_none_mean" not in board  # shown once, as acc_noaug


def test_compression_trains_the_full_data_once_for_every_cell(mlflow_store):
    rows = []
    for method, ipc in (("random", 1), ("kcenter", 1), ("random", 3)):
        cell = compression.open_cell(**TINY, method=method, ipc=ipc, real_recipe={"epochs": 1})
        result = compression.evaluate(cell, compression.obtain(cell))
        cell.close()
        rows.append(result.per_seed.iloc[0])
        assert result.images == 10 * ipc and result.ratio == pytest.approx(10 * ipc / 1347)
    assert len({r.acc_full for r in rows}) == 1
    real = tracking.runs("compression", kind="eval")
    assert (real["tags.ddlib.role"] == "real-full").sum() == 1  # trained once, reused twice
    board = report.compression_leaderboard()
    assert sorted(zip(board.method, board.ipc)) == [("kcenter", 1), ("random", 1), ("random", 3)]
    assert report.plot_compression(board) is not None


def test_synthesis_versus_selection():
    board = pd.DataFrame({"dataset": "d", "model": "m", "family": "f", "method": ["random", "kcenter", "dm"] * 3,
                          "ipc": [1, 1, 1, 10, 10, 10, 50, 50, 50],
                          "acc_set_mean": [.2, .25, .3, .5, .45, .52, .7, .72, .71]})
    table = report.synthesis_vs_selection(board)
    assert list(table.ipc) == [1, 10, 50]
    assert list(table.beats_selection) == [True, True, False]
    assert list(table.margin.round(2)) == [0.05, 0.02, -0.01]
    assert set(table.beats_selection_up_to_ipc) == {10}
    # another setting (another recipe, say) is compared within itself, never with the first
    other = board.assign(family="g", acc_set_mean=[.2, .1, .3, .5, .4, .6, .7, .6, .8])
    both = report.synthesis_vs_selection(pd.concat([board, other]))
    assert list(both.beats_selection) == [True, True, False, True, True, True]
    assert list(both.beats_selection_up_to_ipc) == [10, 10, 10, 50, 50, 50]


def test_transfer_reference_and_others(mlflow_store):
    cell = transfer.open_cell(**TINY, method="random", ipc=2, models=["convnet", "mlp", "alexnet"],
                              model_recipes={"mlp": {"epochs": 1}})
    result = transfer.evaluate(cell, transfer.obtain(cell))
    cell.close()
    row = result.per_seed.iloc[0]
    assert row.acc_reference == row.acc_convnet
    assert row.acc_others_avg == pytest.approx((row.acc_mlp + row.acc_alexnet) / 2)
    evals = tracking.runs("transfer", kind="eval")
    assert dict(zip(evals["params.model"], evals["params.recipe.epochs"])) == {"convnet": "2", "mlp": "1", "alexnet": "2"}


def test_transfer_refuses_an_architecture_too_small_for_the_images_before_training(mlflow_store):
    with pytest.raises(ValueError, match="models: lenet cannot be trained on digits"):
        transfer.open_cell(**TINY, method="random", models=["convnet", "lenet"])
    assert tracking.runs("transfer", kind="eval").empty
    assert tracking.runs("transfer", status="FAILED", kind="cell").shape[0] == 1


def test_transfer_tau_measures_whether_the_ranking_survives():
    board = pd.DataFrame({"dataset": "d", "ipc": 10, "model": "convnet", "family": "f", "method": ["a", "b", "c"],
                          "acc_reference_mean": [.5, .4, .3], "acc_convnet_mean": [.5, .4, .3],
                          "acc_mlp_mean": [.3, .2, .1], "acc_vit_mean": [.1, .2, .3]})
    tau = report.transfer_tau(board).set_index("model")
    assert list(tau.index) == ["mlp", "vit"]
    assert tau.loc["mlp", "tau"] == pytest.approx(1.0) and tau.loc["mlp", "ranking_preserved"]
    assert tau.loc["vit", "tau"] == pytest.approx(-1.0) and not tau.loc["vit", "ranking_preserved"]
    # the same methods under another recipe are another family: each gets its own tau, none is counted twice
    twice = report.transfer_tau(pd.concat([board, board.assign(family="g")]))
    assert len(twice) == 4 and set(twice.methods) == {3}


def test_nas_ranks_architectures_against_the_ground_truth(mlflow_store, tmp_path):
    gt = tmp_path / "gt.csv"
    pd.DataFrame({"ArchitectureString": ARCHS, "CIFAR10TestAccuracy200Epochs": [94.0, 90.0, 10.0, 85.0]}).to_csv(
        gt, index=False)
    cell = nas.open_cell(**TINY, method="random", ipc=2, ground_truth=str(gt), gt_column="CIFAR10TestAccuracy200Epochs",
                         num_archs=3, arch_seed=1, C=4, N=1)
    archs = nas.sample(cell)
    assert len(archs) == 3 and set(archs.arch) <= set(ARCHS)
    result = nas.evaluate(cell, nas.obtain(cell), archs)
    cell.close()
    row = result.per_seed.iloc[0]
    table = result.architectures
    assert row.spearman == pytest.approx(scipy.stats.spearmanr(table.proxy_seed0, table.ground_truth).statistic)
    assert row.kendall == pytest.approx(scipy.stats.kendalltau(table.proxy_seed0, table.ground_truth).statistic)
    assert row.top1 == table.ground_truth[table.proxy_seed0.idxmax()]
    assert row.best_possible == table.ground_truth.max()
    evals = tracking.runs("nas", kind="eval")
    assert len(evals) == 3 and set(evals["params.model"]) == {"nasbench201"}
    artifacts = tracking.client().list_artifacts(cell.run_id)
    assert "architectures.csv" in [a.path for a in artifacts]
    board = report.nas_leaderboard()
    assert board.loc[0, "spearman_mean"] == row.spearman
