"""DC-Bench's protocols end to end on the embedded digits data: augmentation, compression, transfer, NAS."""

import json
import math

import pandas as pd
import pytest
import torch

from ddlib.store import tracking
from ddlib import report
from ddlib.data.datasets import Dataset
from ddlib.protocols import augmentation, compression, nas, transfer
from ddlib.protocols.cell import TrainedModel
from ddlib.protocols.dcbench import best_by_mean, setting_recipe

TINY = {"dataset": "digits", "seeds": [0], "device": "cpu", "recipe": {"epochs": 2, "batch_size": 64}, "aug_epochs": 2}
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
    (nas, {"ground_truth": "x.csv", "sampling": "classes"}, "sampling must be one of"),
    (nas, {"ground_truth": "x.csv", "val_fraction": 0}, "val_fraction must be a number in"),
    (nas, {"ground_truth": "x.csv", "recipe": {"grad_clip": -1}}, "recipe: .*grad_clip"),
])
def test_bad_parameters_are_refused_naming_the_key(module, bad, message):
    with pytest.raises(ValueError, match=message):
        module.validate({**({"dataset": "cifar10"} if module is nas else {}), **bad})


def test_recipe_epochs_follow_dcbench():
    p = augmentation.validate({"real_recipe": {"epochs": 7}})
    assert setting_recipe(p, None).epochs == 300  # DC-Bench without augmentation
    assert setting_recipe(p, "dsa").epochs == 1000  # and with
    assert setting_recipe(p, "dsa", full=True).epochs == 7  # the full data's overrides win
    full = augmentation.validate({"method": "full", "real_recipe": {"epochs": 7}})
    assert setting_recipe(full, None).epochs == 7  # method full trains with real_recipe


# DC's evaluation loop (VICO-UoE/DatasetCondensation utils.py evaluate_synset; DC-Bench's
# evaluator_utils.py evaluate_synset_dataset is the same): ``for ep in range(Epoch+1)`` with
# ``lr_schedule = [Epoch//2+1]`` and a new SGD optimizer at the drop. For Epoch = 300: 301 epochs,
# 152 at lr 0.01 then 149 at 0.001; for 1000: 1001 epochs, 502 then 499.
@pytest.mark.parametrize("module", [augmentation, compression, transfer])
def test_dcbench_protocols_train_with_dcs_schedule_by_default(module):
    import torch
    from ddlib.engine.recipe import _scheduler, epochs_trained

    p = module.validate({})
    assert module.REVISION >= 4
    for augment, epochs, high in ((None, 301, 152), ("dsa", 1001, 502)):
        recipe = setting_recipe(p, augment)
        assert recipe.scheduler == "dc_step" and epochs_trained(recipe) == epochs
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=recipe.lr, momentum=0.9)
        scheduler, lrs = _scheduler(recipe, optimizer), []
        for _ in range(epochs):
            lrs.append(optimizer.param_groups[0]["lr"])
            scheduler.step()
        assert lrs == pytest.approx([0.01] * high + [0.001] * (epochs - high))
    assert setting_recipe(module.validate({"recipe": {"scheduler": "step"}}), None).scheduler == "step"  # the old one, named
    # the NAS proxy is DC-Bench's darts-pt recipe (cosine), not evaluate_synset's
    assert setting_recipe(nas.validate({"dataset": "cifar10", "ground_truth": "x.csv"}), None,
                            base=nas.PROXY_RECIPE).scheduler == "cosine"


def test_augmentation_names_mean_dcbench_batch_draws_everywhere():
    """One behaviour per name: the protocol default (which the notebook's parameters cell and
    ``ddlib score`` use) draws the policies once per batch, as DC-Bench's single torchvision call
    on the whole batch (evaluator_utils.py ``custom_aug``); per-image draws carry their own label."""
    from ddlib.engine.augment import create_augment
    from ddlib.protocols.dcbench import augment_label

    p = augmentation.validate({})
    for spec in p["augmentations"]:
        if spec in ("autoaugment", "randaugment", "imagenet_aug"):
            assert "draw=batch" in create_augment(spec, mean=(0.5,) * 3, std=(0.5,) * 3, num_classes=10).name
    assert augment_label({"autoaugment": {"draw": "image"}}) == "autoaugment_per_image"
    assert augment_label({"autoaugment": {"draw": "batch"}}) == augment_label("autoaugment") == "autoaugment"
    both = augmentation.validate({"augmentations": ["autoaugment", {"autoaugment": {"draw": "image"}}]})
    assert [augment_label(a) for a in both["augmentations"]] == ["autoaugment", "autoaugment_per_image"]
    with pytest.raises(ValueError, match="each op may appear once"):
        augmentation.validate({"augmentations": ["autoaugment", {"autoaugment": {"draw": "batch"}}]})


@pytest.mark.parametrize("module", [compression, transfer])
def test_compression_and_transfer_train_with_dsa_for_1000_epochs_by_default(module):
    """DC-Bench's Tables 2, 5 and 6 train every set, and the whole training set, with DSA."""
    p = module.validate({})
    assert p["augment"] == "dsa"
    assert setting_recipe(p, p["augment"]).epochs == 1000
    assert setting_recipe(p, p["augment"], full=True).epochs == 1000  # the full-data line too
    assert setting_recipe(module.validate({"augment": None}), None).epochs == 300


def test_nas_defaults_are_dcbench_proxy_recipe_on_ipc_50():
    p = nas.validate({"dataset": "cifar10", "ground_truth": "x.csv"})
    assert p["ipc"] == 50 and p["sampling"] == "uniform" and p["val_fraction"] == 0.2
    proxy = setting_recipe(p, None, base=nas.PROXY_RECIPE)
    assert (proxy.epochs, proxy.batch_size, proxy.lr, proxy.lr_min, proxy.scheduler) == (50, 64, 0.025, 0.001, "cosine")
    assert (proxy.momentum, proxy.weight_decay, proxy.grad_clip) == (0.9, 3e-4, 5.0)
    assert setting_recipe(p, None, full=True, base=nas.PROXY_RECIPE).epochs == 10  # full data: 10 epochs
    assert setting_recipe(nas.validate({**p, "recipe": {"epochs": 3}}), None, base=nas.PROXY_RECIPE).lr == 0.025


def test_nas_proxies_keep_their_50_epochs_when_augment_is_set(mlflow_store, tmp_path, monkeypatch):
    """``aug_epochs`` (1000) comes with the shared recipe parameters; DC-Bench's NAS proxies train 50
    epochs (darts-pt train_search.py), with or without augmentation. Before: 1000 under ``augment``."""
    p = nas.validate({"dataset": "cifar10", "ground_truth": "x.csv", "augment": "dsa"})
    assert p["aug_epochs"] is None
    assert setting_recipe(p, p["augment"], base=nas.PROXY_RECIPE).epochs == 50
    calls = []
    monkeypatch.setattr(nas, "train_settings", _fake_training(NAS_PROXY, calls))
    cell = nas.open_cell(dataset="digits", seeds=[0], device="cpu", recipe={"epochs": 3}, augment="dsa",
                         method="random", ipc=2, ground_truth=str(_nas_table(tmp_path)),
                         gt_column="CIFAR10TestAccuracy200Epochs", num_archs=4, C=4)
    nas.evaluate(cell, nas.obtain(cell), pd.DataFrame({"arch": ARCHS, "accuracy": NAS_GT}))
    cell.close()
    assert {c.recipe.epochs for c in calls[0]["conditions"]} == {3}  # the recipe's, augmented or not
    assert {str(c.augment) for c in calls[0]["conditions"]} == {"dsa"}
    # a number still asks for its epochs under augment
    chosen = nas.validate({"dataset": "cifar10", "ground_truth": "x.csv", "augment": "dsa", "aug_epochs": 7})
    assert setting_recipe(chosen, "dsa", base=nas.PROXY_RECIPE).epochs == 7


@pytest.mark.parametrize("module", [augmentation, compression, transfer])
def test_dcbench_trains_the_4_layer_convnet_on_tiny_imagenet(module):
    """DC-Bench's ConvNet for Tiny ImageNet (64 px) is its ``convnet4`` (networks/network_utils.py; the
    README's ``--model convnet4``). An unset model is convnet_d4 there; a 3-layer one is refused by name,
    before anything runs; 32 px data keep depth 3. Before: convnet (depth 3) at 64 px."""
    p = module.validate({"dataset": "tinyimagenet"})
    assert p["model"] == "convnet_d4"
    if module is transfer:
        assert "convnet_d4" in p["models"] and "convnet" not in p["models"]
    with pytest.raises(ValueError, match="model: convnet is the 3-layer ConvNet.*give convnet_d4"):
        module.validate({"dataset": "tinyimagenet", "model": "convnet"})
    with pytest.raises(ValueError, match="give convnet_d4_bn"):
        module.validate({"dataset": "tinyimagenet", "model": "convnet_bn",
                         **({"models": ["convnet_bn"]} if module is transfer else {})})
    assert module.validate({"dataset": "cifar10"})["model"] == "convnet"
    if module is transfer:
        with pytest.raises(ValueError, match="models: convnet is the 3-layer"):
            module.validate({"dataset": "tinyimagenet", "model": "convnet_d4", "models": ["convnet_d4", "convnet"]})


@pytest.mark.parametrize("module", [augmentation, compression, transfer])
def test_a_3_layer_convnet_on_64_px_images_of_an_image_folder_is_refused_before_training(module, mlflow_store,
                                                                                          tmp_path):
    """A dataset the name does not size (an image folder of 64 px images): refused once it is loaded,
    the cell failed, no model trained."""
    from PIL import Image

    for split, count in (("train", 2), ("test", 1)):
        for c in range(2):
            folder = tmp_path / "tree" / split / f"c{c}"
            folder.mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (64, 64), (100 * c, 50, 20 * i)).save(folder / f"{i}.png")
    params = {**TINY, "dataset": f"imagefolder:{tmp_path / 'tree'}", "method": "random", "ipc": 1}
    if module is transfer:
        params["models"] = ["convnet"]
    with pytest.raises(ValueError, match="convnet is the 3-layer ConvNet.*give convnet_d4"):
        module.open_cell(**params)
    assert tracking.runs(module.PROTOCOL, kind="eval").empty
    assert tracking.runs(module.PROTOCOL, status="FAILED", kind="cell").shape[0] == 1


def _fake_training(accuracies: dict, calls: list | None = None):
    """A stand-in for train_settings: ``accuracies[label][s]`` is seed s's accuracy (a fraction; a
    one-element list serves every seed)."""
    def train(cell, subset, conditions, role="syn", keep_models=False, eval_split="test"):
        if calls is not None:
            calls.append({"role": role, "eval_split": eval_split, "labels": [c.label for c in conditions],
                          "conditions": conditions})
        values = {c.label: accuracies[c.label] for c in conditions}
        return {label: [TrainedModel(role, seed, v[min(seed, len(v) - 1)], 0.0, 0.0, "fake", True)
                        for seed in cell.params["seeds"]] for label, v in values.items()}
    return train


def test_best_augmentation_is_the_highest_mean_not_the_mean_of_per_seed_maxima(mlflow_store, monkeypatch):
    """Seed 0 peaks under DSA, seed 1 under flip; flip has the higher mean (0.70 against 0.65), so
    the best is flip with its own mean and std (0.70 ± 0.10), not (0.80 + 0.80) / 2 = 0.80."""
    assert best_by_mean({"dsa": [0.8, 0.5], "flip": [0.6, 0.8]}) == "flip"
    assert best_by_mean({"a": [0.5], "b": [0.5]}) == "a"  # ties: the first listed
    monkeypatch.setattr(augmentation, "train_settings",
                        _fake_training({"none": [0.4, 0.4], "dsa": [0.8, 0.5], "flip": [0.6, 0.8]}))
    cell = augmentation.open_cell(**{**TINY, "seeds": [0, 1]}, method="random", ipc=1,
                                  augmentations=["none", "dsa", {"flip": {"p": 1.0}}])
    result = augmentation.evaluate(cell, augmentation.obtain(cell))
    cell.close()
    assert result.best == "flip"
    assert list(result.per_seed.acc_aug_best) == pytest.approx([60.0, 80.0])  # in % (ddlib.specs.units)
    assert result.summary["acc_aug_best_mean"] == pytest.approx(70.0)
    assert result.summary["acc_aug_best_std"] == pytest.approx(10.0)
    assert result.summary["acc_aug_avg_mean"] == pytest.approx(67.5)
    assert tracking.client().get_run(cell.run_id).data.tags["ddlib.aug_best"] == "flip"
    board = report.augmentation_leaderboard()
    assert board.loc[0, "aug_best"] == "flip"
    assert board.loc[0, "acc_aug_best_mean"] == pytest.approx(0.7) and board.loc[0, "acc_aug_best_std"] == pytest.approx(0.1)


def test_leaderboard_picks_the_best_from_seeds_pooled_over_runs(mlflow_store, monkeypatch):
    """Two runs of one configuration, one seed each: the leaderboard pools them before choosing."""
    monkeypatch.setattr(augmentation, "train_settings",
                        _fake_training({"none": [0.4, 0.4], "dsa": [0.8, 0.5], "flip": [0.6, 0.8]}))
    for seed in (0, 1):  # alone, seed 0's best is dsa and seed 1's is flip
        cell = augmentation.open_cell(**{**TINY, "seeds": [seed]}, method="random", ipc=1,
                                      augmentations=["none", "dsa", {"flip": {"p": 1.0}}])
        augmentation.evaluate(cell, augmentation.obtain(cell))
        cell.close()
    board = report.augmentation_leaderboard()
    assert len(board) == 1 and board.loc[0, "seeds"] == 2
    assert board.loc[0, "aug_best"] == "flip" and board.loc[0, "acc_aug_best_mean"] == pytest.approx(0.7)


def test_transfer_reports_dcbench_four_architecture_average_beside_the_mean_over_all(mlflow_store, monkeypatch):
    """DC-Bench's Table 2, Random CIFAR-10 IPC 10: MLP 25.08, ResNet-18 29.52, ResNet-152 15.84,
    ViT 26.21 -> "Transfer" 24.16; the mean over every architecture but ConvNet includes AlexNet."""
    published = {"convnet": [0.2640], "mlp": [0.2508], "resnet18": [0.2952], "resnet152": [0.1584], "vit": [0.2621],
                 "alexnet": [0.2000]}
    monkeypatch.setattr(transfer, "train_settings", _fake_training(published))
    monkeypatch.setattr(transfer, "create_model", lambda *a, **k: None)  # no need to build ResNet-152 here
    cell = transfer.open_cell(**TINY, method="random", ipc=1, models=list(published))
    result = transfer.evaluate(cell, transfer.obtain(cell))
    cell.close()
    row = result.per_seed.iloc[0]
    assert round(row.acc_transfer, 2) == 24.16  # in % (ddlib.specs.units)
    assert row.acc_others_avg == pytest.approx(100 * (0.2508 + 0.2952 + 0.1584 + 0.2621 + 0.2000) / 5)
    board = report.transfer_leaderboard()
    assert round(100 * board.loc[0, "acc_transfer_mean"], 2) == 24.16
    assert "acc_others_avg_mean" in board
    shown = report.format_leaderboard(board)
    assert list(shown.columns[:3]) == ["dataset", "data", "ipc"] and shown.loc[0, "data"] == "digits"


def test_transfer_average_is_absent_without_dcbench_four_architectures(mlflow_store, monkeypatch):
    monkeypatch.setattr(transfer, "train_settings", _fake_training({"convnet": [0.5], "mlp": [0.3]}))
    cell = transfer.open_cell(**TINY, method="random", ipc=1, models=["convnet", "mlp"])
    result = transfer.evaluate(cell, transfer.obtain(cell))
    cell.close()
    assert "acc_transfer" not in result.per_seed and result.per_seed.iloc[0].acc_others_avg == pytest.approx(30.0)


def test_radar_never_shows_the_other_architecture_mean_as_dcbench_transfer():
    """The radar's transfer axis is DC-Bench's four-architecture "Transfer"; a grid without those
    four gets its mean over the other architectures on an axis of its own name."""
    from ddlib.report.boards import Boards
    from ddlib.report.plots import OTHERS_AXIS, TRANSFER_AXIS, radar_profile

    rows = {"method": ["dc", "random"], "dataset": ["digits"] * 2, "ipc": [10, 10],
            "acc_transfer_mean": [0.2416, float("nan")], "acc_others_avg_mean": [0.25, 0.30]}
    boards = Boards(tables={"transfer": pd.DataFrame(rows)})
    dc, random = radar_profile(boards, "dc", "digits", 10), radar_profile(boards, "random", "digits", 10)
    assert dc[TRANSFER_AXIS][0] == pytest.approx(0.2416) and OTHERS_AXIS not in dc
    assert TRANSFER_AXIS not in random  # never 0.30 under DC-Bench's name
    assert random[OTHERS_AXIS][0] == pytest.approx(0.30) and "not DC-Bench" in random[OTHERS_AXIS][1]
    assert TRANSFER_AXIS != OTHERS_AXIS
    nothing = radar_profile(Boards(), "dc", "digits", 10)
    assert nothing[TRANSFER_AXIS][1] == "not run"


def test_radar_labels_a_best_of_several_variants_and_draws_random_from_the_sets_setting():
    """A board sorted by score lists a set's best variant first. The radar says when it shows the best of
    several (before: the first row, silently), keeps the rows of a precision when asked, and the card's
    random baseline comes from the family (setting) of the row the set's radar shows, not random's best."""
    from ddlib.report.boards import Boards
    from ddlib.report.plots import radar_profile

    lrs = pd.DataFrame({"method": ["dc", "random", "dc", "random"], "dataset": ["digits"] * 4, "ipc": [10] * 4,
                        "family": ["bf16-recipe", "fp32-recipe", "fp32-recipe", "bf16-recipe"],
                        "precision": ["bf16", "fp32", "fp32", "bf16"], "lrs_mean": [40.0, 35.0, 30.0, 25.0]})
    boards = Boards(tables={"lrs": lrs})
    dc = radar_profile(boards, "dc", "digits", 10)
    assert dc["LRS"] == (pytest.approx(0.40), "40.0 / 100 (best of 2 variants)")
    from ddlib.report.plots import radar_families

    assert radar_profile(boards, "dc", "digits", 10, precision="fp32")["LRS"] == (pytest.approx(0.30), "30.0 / 100")
    assert radar_families(boards, "dc", "digits", 10) == {"lrs": "bf16-recipe"}
    random = radar_profile(boards, "random", "digits", 10, families=radar_families(boards, "dc", "digits", 10))
    assert random["LRS"] == (pytest.approx(0.25), "25.0 / 100")  # random's best (35, another setting) is not it
    assert radar_profile(boards, "random", "digits", 10, families={"lrs": "elsewhere"})["LRS"][1] == "not run"
    # a board not sorted by its score (BEARD's sorts by family before CREI): the best is still the best
    beard = pd.DataFrame({"method": ["dc", "dc"], "dataset": ["digits"] * 2, "ipc": [10] * 2, "mode": ["untargeted"] * 2,
                          "family": ["a-pixel", "b-beard_compat"], "crei_mean": [20.0, 45.0]})
    shown = radar_profile(Boards(tables={"beard": beard}), "dc", "digits", 10)
    assert shown["CREI"] == (pytest.approx(0.45), "45.0 / 100 (best of 2 variants)")
    assert radar_families(Boards(tables={"beard": beard}), "dc", "digits", 10) == {"beard": "b-beard_compat"}


def test_data_source_label():
    def fake(name, extensions):
        return Dataset(name, torch.zeros(1, 3, 2, 2), torch.tensor([0]), torch.zeros(1, 3, 2, 2), torch.tensor([0]),
                       ("a",), (0.5,) * 3, (0.5,) * 3, extra={"file_extensions": extensions} if extensions else {})

    assert fake("cifar10", (".jpg",)).label == "CIFAR-10 (JPEG)"
    assert fake("cifar10", None).label == "CIFAR-10"  # torchvision's pickles: the original images
    assert fake("cifar10", (".png",)).label == "CIFAR-10"
    assert fake("mnist", None).label == "MNIST" and fake("digits", None).label == "digits"


# ------------------------------------------------------------------ end to end


def test_augmentation_trains_each_augmentation_with_its_epochs_end_to_end(mlflow_store):
    """Real training (tiny): 2 epochs without augmentation, ``aug_epochs`` with; the policy ops with
    ``draw: batch`` run through the protocol. The summaries' definitions are pinned above."""
    cell = augmentation.open_cell(**{**TINY, "aug_epochs": 3}, method="random", ipc=3,
                                  augmentations=["none", "dsa", {"imagenet_aug": {"draw": "batch"}}])
    result = augmentation.evaluate(cell, augmentation.obtain(cell))
    cell.close()
    evals = tracking.runs("augmentation", kind="eval")
    epochs = {r["tags.ddlib.role"]: r["params.recipe.epochs"] for _, r in evals.iterrows()}
    assert epochs == {"syn-none": "2", "syn-dsa": "3", "syn-imagenet_aug": "3"}
    assert "draw=batch" in evals.set_index("tags.ddlib.role").loc["syn-imagenet_aug", "params.augment"]
    assert result.best in ("dsa", "imagenet_aug")
    board = report.augmentation_leaderboard()
    assert len(board) == 1 and board.loc[0, "aug_best"] == result.best
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
    # relative (ddlib's own column, no benchmark defines it): each seed's set accuracy over that seed's
    # full-data accuracy, so 100 % means the set trains as well as the whole training set
    assert [r.relative for r in rows] == pytest.approx([100 * r.acc_set / r.acc_full for r in rows])
    real = tracking.runs("compression", kind="eval")
    assert (real["tags.ddlib.role"] == "real-full").sum() == 1  # trained once, reused twice
    assert (real["params.augment"] == "dsa(strategy=color_crop_cutout_flip_scale_rotate, mode=one)").all()
    board = report.compression_leaderboard()
    assert sorted(zip(board.method, board.ipc)) == [("kcenter", 1), ("random", 1), ("random", 3)]
    assert set(board["data"]) == {"digits"}  # the data source, in every leaderboard
    cells = tracking.runs("compression", kind="cell")
    assert set(cells["tags.ddlib.data"]) == {"digits"}
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
    assert set(evals["params.augment"].str.startswith("dsa(")) == {True}  # DC-Bench: DSA on every architecture


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


NAS_GT = [94.0, 90.0, 85.0, 10.0]
# Seed 0 ranks the four perfectly (rho 1); seed 1 gets the order 2,4,3,1 wrong (rho -0.2). The mean of the
# per-seed correlations would be 0.4; DC-Bench correlates the seed-averaged proxy (25, 31, 22, 11): rho 0.8,
# tau 4/6, and its first-ranked architecture is the 90 % one.
NAS_PROXY = {"arch000": [0.40, 0.10], "arch001": [0.30, 0.32], "arch002": [0.20, 0.24], "arch003": [0.10, 0.12]}


def _nas_table(tmp_path):
    gt = tmp_path / "gt.csv"
    pd.DataFrame({"ArchitectureString": ARCHS, "CIFAR10TestAccuracy200Epochs": NAS_GT}).to_csv(gt, index=False)
    return gt


def test_nas_correlates_the_seed_averaged_proxy_on_the_validation_split(mlflow_store, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(nas, "train_settings", _fake_training(NAS_PROXY, calls))
    cell = nas.open_cell(**{**TINY, "seeds": [0, 1]}, method="random", ipc=2, ground_truth=str(_nas_table(tmp_path)),
                         gt_column="CIFAR10TestAccuracy200Epochs", num_archs=4, C=4)
    archs = pd.DataFrame({"arch": ARCHS, "accuracy": NAS_GT})
    result = nas.evaluate(cell, nas.obtain(cell), archs)
    cell.close()
    assert calls[0]["eval_split"] == "val"  # never the test set
    assert result.summary["spearman"] == pytest.approx(0.8)
    assert result.summary["kendall"] == pytest.approx(4 / 6)
    assert result.summary["top1"] == 90.0 and result.summary["best_possible"] == 94.0
    assert list(result.architectures.proxy) == pytest.approx([25.0, 31.0, 22.0, 11.0])
    logged = tracking.client().get_run(cell.run_id).data.metrics
    assert logged["spearman"] == pytest.approx(0.8)
    board = report.nas_leaderboard()
    assert len(board) == 1 and board.loc[0, "spearman_mean"] == pytest.approx(0.8) and board.loc[0, "seeds"] == 2
    assert board.loc[0, "data"] == "digits"
    # the interval resamples seeds and correlates their mean again: {0, 0} -> 1.0, {1, 1} -> -0.2, {0, 1} -> 0.8
    assert board.loc[0, "spearman_low"] == pytest.approx(-0.2) and board.loc[0, "spearman_high"] == pytest.approx(1.0)
    assert json.loads(board.loc[0, "spearman_per_seed"]) == {"0": pytest.approx(1.0), "1": pytest.approx(-0.2)}


def test_nas_proxies_are_dcbench_search_networks_with_non_affine_cell_batch_norm(mlflow_store, tmp_path, monkeypatch):
    """DC-Bench's proxies (darts-pt/nasbench201 ``TinyNetworkDarts``: cells with ``affine=False``):
    every architecture the protocol trains is built with non-affine BatchNorm inside its cells."""
    from ddlib.models import create_model

    calls = []
    monkeypatch.setattr(nas, "train_settings", _fake_training(NAS_PROXY, calls))
    cell = nas.open_cell(**TINY, method="random", ipc=2, ground_truth=str(_nas_table(tmp_path)),
                         gt_column="CIFAR10TestAccuracy200Epochs", num_archs=4, C=4)
    nas.evaluate(cell, nas.obtain(cell), pd.DataFrame({"arch": ARCHS, "accuracy": NAS_GT}))
    cell.close()
    assert nas.REVISION >= 4
    for c in calls[0]["conditions"]:
        assert c.model_kwargs["cell_affine"] is False
        model = create_model(c.model, 1, 10, 8, **c.model_kwargs)
        cells = [m for m in model.cells if type(m).__name__ == "InferCell"]
        assert all(not bn.affine for m in cells for bn in m.modules() if isinstance(bn, torch.nn.BatchNorm2d))
        assert model.stem[1].affine and model.lastact[0].affine


def test_nas_leaderboard_pools_seeds_over_runs_before_correlating(mlflow_store, tmp_path, monkeypatch):
    monkeypatch.setattr(nas, "train_settings", _fake_training(NAS_PROXY))
    archs = pd.DataFrame({"arch": ARCHS, "accuracy": NAS_GT})
    alone = {}
    for seed in (0, 1):
        cell = nas.open_cell(**{**TINY, "seeds": [seed]}, method="random", ipc=2, ground_truth=str(_nas_table(tmp_path)),
                             gt_column="CIFAR10TestAccuracy200Epochs", num_archs=4, C=4)
        alone[seed] = nas.evaluate(cell, nas.obtain(cell), archs).summary["spearman"]
        cell.close()
    assert alone == {0: pytest.approx(1.0), 1: pytest.approx(-0.2)}
    board = report.nas_leaderboard()
    assert len(board) == 1 and board.loc[0, "seeds"] == 2 and board.loc[0, "spearman_mean"] == pytest.approx(0.8)


def test_nas_trains_on_the_training_split_and_scores_on_the_validation_split(mlflow_store, tmp_path):
    """End to end (tiny): 20 % of the training images are held out; the proxies are scored there with
    DC-Bench's proxy recipe; the sampled architectures are drawn uniformly over the table's strings."""
    cell = nas.open_cell(**TINY, method="random", ipc=2, ground_truth=str(_nas_table(tmp_path)),
                         gt_column="CIFAR10TestAccuracy200Epochs", num_archs=3, arch_seed=1, C=4, N=1)
    assert len(cell.validation[1]) == pytest.approx(0.2 * 1347, abs=5)
    assert len(cell.dataset.train_labels) + len(cell.validation[1]) == 1347
    archs = nas.sample(cell)
    assert len(archs) == 3 and set(archs.arch) <= set(ARCHS)
    result = nas.evaluate(cell, nas.obtain(cell), archs)
    cell.close()
    evals = tracking.runs("nas", kind="eval")
    assert len(evals) == 3 and set(evals["params.model"]) == {"nasbench201"}
    assert set(evals["params.eval_split"]) == {"val"}
    assert set(evals["params.recipe.lr"]) == {"0.025"} and set(evals["params.recipe.grad_clip"]) == {"5.0"}
    assert set(evals["params.recipe.scheduler"]) == {"cosine"} and set(evals["params.recipe.epochs"]) == {"2"}
    assert math.isfinite(result.summary["spearman"])  # ranked (the correlations' values: against scipy, by hand)
    artifacts = tracking.client().list_artifacts(cell.run_id)
    assert "architectures.csv" in [a.path for a in artifacts]


def test_recipe_cosine_floor_and_gradient_clipping():
    """The two recipe keys DC-Bench's NAS proxy needs: the cosine schedule ends at ``lr_min`` and
    ``grad_clip`` bounds the gradient norm; recipes without them keep their earlier reuse keys."""
    from ddlib.engine.recipe import _scheduler
    from ddlib.engine.train import Recipe, train_and_test

    recipe = Recipe(epochs=50, lr=0.025, scheduler="cosine", lr_min=0.001, grad_clip=5.0)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=recipe.lr)
    scheduler = _scheduler(recipe, optimizer)
    for _ in range(recipe.epochs):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.001)
    assert "lr_min" not in Recipe().to_dict() and "grad_clip" not in Recipe().to_dict()
    assert Recipe.from_dict(recipe.to_dict()) == recipe
    with pytest.raises(ValueError, match="grad_clip"):
        Recipe(grad_clip=0)

    from ddlib.data.datasets import load_dataset

    ds = load_dataset("digits")
    images, labels = ds.train_images[:64], ds.train_labels[:64]

    def moved(clip):
        torch.manual_seed(0)
        (r,) = train_and_test("mlp", images, labels, images, labels, num_classes=10, mean=ds.mean, std=ds.std,
                                  recipe=Recipe(epochs=1, batch_size=64, lr=1.0, momentum=0.0, weight_decay=0.0,
                                                scheduler="none", grad_clip=clip), seeds=[0], device="cpu",
                                  keep_models=True)
        torch.manual_seed(0)
        from ddlib.models import create_model
        start = create_model("mlp", 1, 10, (8, 8))
        return torch.cat([(a - b).detach().flatten() for a, b in zip(r.model.parameters(), start.parameters())]).norm()

    assert float(moved(1e-3)) == pytest.approx(1e-3, rel=1e-3)  # one SGD step of lr 1: the clipped norm
    assert float(moved(None)) > 0.01
