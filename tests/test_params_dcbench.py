"""The shipped DC-Bench params files hold what DC-Bench's tables need.

Checked on every cell of ``params/dcbench_*.yaml`` as the runner expands it (``ddlib.run.runner.expand``),
through the recipe each training resolves to, so a default that changes underneath a file is caught
too. What DC-Bench needs, from its released code (justincui03/dc_benchmark):

* ``evaluator/evaluator.py``: ``--num_eval 5`` (five models per set, mean and std over them);
  ``--epoch_eval_train 300``, 1000 whenever ``--dsa`` or ``--aug`` is given; ``--lr_net 0.01``,
  ``--batch_train 256``, SGD; DSA with ``ParamDiffAug`` (``aug_mode 'S'``: one op per batch) and
  ``dsa_strategy color_crop_cutout_flip_scale_rotate``; IPC 1, 10 and 50 (its README).
* ``evaluator/evaluator_utils.py`` ``evaluate_synset_dataset``: ``Epoch + 1`` epochs, lr x 0.1 and a
  new optimizer after epoch ``Epoch // 2 + 1`` (Recipe ``scheduler: dc_step``); ``custom_aug``: one
  torchvision call per batch (``draw: batch``).
* ``darts-pt/nasbench201/train_search.py``: the NAS proxy (50 epochs, SGD 0.025 cosine to 0.001,
  momentum 0.9, wd 3e-4, batch 64, clip 5, 3-cell network, ``train_portion`` 0.8), the full data 10
  epochs; ranked over 100 architectures by the mean of 5 seeds.
* fp32 throughout (DC-Bench trains in fp32; bf16 was never compared for ResNet-152, ViT, NAS cells
  or 1000-epoch DSA runs, so the files name ``precision: fp32``).

The one-seed NAS grid went unnoticed because nothing checked this.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ddlib.engine.augment import create_augment
from ddlib.engine.train import Recipe, epochs_trained
from ddlib.protocols import nas, transfer
from ddlib.protocols.dcbench import augment_label, setting_recipe
from ddlib.run.runner import expand, load_grid

PARAMS = Path(__file__).resolve().parents[1] / "params"
SEEDS = [0, 1, 2, 3, 4]  # num_eval 5
DC_IPCS = {1, 10, 50}
COMPRESSION_IPCS = {1, 10, 50, *range(100, 1001, 100)}
DSA = "dsa(strategy=color_crop_cutout_flip_scale_rotate, mode=one)"
POLICIES = ("autoaugment", "randaugment", "imagenet_aug")


def _cells(name: str, tmp_path) -> list[dict]:
    spec = load_grid(PARAMS / f"dcbench_{name}.yaml")
    assert spec.params["dataset"] == "cifar10", name
    # the data root is checked for existence only; the cells' contents do not depend on it
    return expand(dataclasses.replace(spec, params={**spec.params, "data_root": str(tmp_path)}))


def _hook_name(spec) -> str:
    return create_augment(spec, mean=(0.5,) * 3, std=(0.5,) * 3, num_classes=10).name


def _dcbench_recipe(recipe: Recipe, epochs: int, where: str) -> None:
    """DC-Bench's evaluate_synset_dataset recipe with ``Epoch = epochs``, in fp32."""
    assert (recipe.optimizer, recipe.lr, recipe.momentum, recipe.weight_decay, recipe.batch_size) == \
        ("sgd", 0.01, 0.9, 5e-4, 256), where
    assert recipe.scheduler == "dc_step" and recipe.epochs == epochs, where
    assert epochs_trained(recipe) == epochs + 1, where
    assert recipe.precision == "fp32", where


def _common(cells: list[dict], name: str) -> None:
    for cell in cells:
        where = f"dcbench_{name}.yaml {cell['method']} IPC {cell['ipc']}"
        assert cell["seeds"] == SEEDS, where
        assert cell["train_per_class"] is None and cell["test_size"] is None, where  # the whole data


def _ipcs(cells: list[dict]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for cell in cells:
        out.setdefault(cell["method"], set()).add(cell["ipc"])
    return out


def test_augmentation_grid(tmp_path):
    cells = _cells("augmentation", tmp_path)
    _common(cells, "augmentation")
    ipcs = _ipcs(cells)
    assert ipcs["random"] == ipcs["kcenter"] == DC_IPCS and ipcs["dc"] <= DC_IPCS
    for cell in cells:
        assert cell["model"] == "convnet"
        labels = [augment_label(a) for a in cell["augmentations"]]
        assert labels == ["none", "dsa", *POLICIES]
        for spec in cell["augmentations"]:
            label = augment_label(spec)
            epochs = 300 if label == "none" else 1000
            _dcbench_recipe(setting_recipe(cell, None if label == "none" else spec), epochs, label)
            if label == "dsa":
                assert _hook_name(spec) == DSA
            elif label in POLICIES:
                assert "draw=batch" in _hook_name(spec), label  # DC-Bench's one draw per batch


@pytest.mark.parametrize("name", ["compression", "transfer"])
def test_compression_and_transfer_grids_train_everything_with_dsa(name, tmp_path):
    cells = _cells(name, tmp_path)
    _common(cells, name)
    ipcs = _ipcs(cells)
    for method in ("random", "kcenter", "dm"):
        assert ipcs[method] == (COMPRESSION_IPCS if name == "compression" else DC_IPCS), (name, method)
    assert ipcs["dc"] <= DC_IPCS
    for cell in cells:
        assert cell["model"] == "convnet" and _hook_name(cell["augment"]) == DSA
        recipe = setting_recipe(cell, cell["augment"])
        _dcbench_recipe(recipe, 1000, name)
        if name == "compression":
            assert cell["full_data"] is True
            _dcbench_recipe(setting_recipe(cell, cell["augment"], full=True), 1000, "full data")
        else:
            assert set(transfer.DCBENCH_TRANSFER_MODELS) <= set(cell["models"]) and "convnet" in cell["models"]
            for model in cell["models"]:
                _dcbench_recipe(Recipe.from_dict(cell["model_recipes"].get(model, {}), base=recipe), 1000, model)


def test_nas_grid(tmp_path):
    cells = _cells("nas", tmp_path)
    _common(cells, "nas")
    ipcs = _ipcs(cells)
    assert ipcs["random"] == ipcs["kcenter"] == {50} and "full" in ipcs  # the full data is one cell, whatever IPC
    for cell in cells:
        assert (cell["num_archs"], cell["sampling"], cell["val_fraction"], cell["C"], cell["N"]) == \
            (100, "uniform", 0.2, 16, 1)
        assert cell["augment"] is None
        proxy = setting_recipe(cell, None, full=False, base=nas.PROXY_RECIPE)
        assert proxy == dataclasses.replace(nas.PROXY_RECIPE, precision="fp32")
        assert (proxy.epochs, proxy.lr, proxy.lr_min, proxy.scheduler, proxy.batch_size, proxy.grad_clip) == \
            (50, 0.025, 0.001, "cosine", 64, 5.0)
        full = setting_recipe(cell, None, full=True, base=nas.PROXY_RECIPE)
        assert full.epochs == 10 and full.precision == "fp32"
    assert nas.CELL_AFFINE is False  # DC-Bench's search cells
