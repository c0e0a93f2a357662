"""The DC-distilled CIFAR-10 IPC 10 set through soft-label LRS and ARS on real CIFAR-10 (JPEG), CPU-sized."""

import pytest
import yaml

from ddlib.protocols.presets import load_preset
from ddlib.protocols import augmentation_robust, label_robust


@pytest.fixture
def convnet_teacher_preset(tmp_path):
    """SRe2L's preset with a ConvNet teacher instead of ResNet-18, so the test fits a 2-core CPU."""
    data = yaml.safe_load(load_preset("sre2l").source.read_text())
    data["labels"]["teacher"] = {"arch": "convnet", "count": 1}
    path = tmp_path / "sre2l_convnet_teacher.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _run(module, **params):
    cell = module.open_cell(**params)
    cell.progress = False
    result = module.evaluate(cell, module.obtain(cell))
    cell.close()
    return result


@pytest.mark.slow
def test_soft_label_lrs_and_ars_on_dc_cifar10_ipc10(mlflow_store, shared_data, cifar10_jpeg_root, convnet_teacher_preset):
    common = dict(dataset="cifar10", data_root=str(cifar10_jpeg_root), method="dc", ipc=10, seeds=[0],
                  source={"kind": "file", "path": str(shared_data / "distilled" / "dc_cifar10_convnet_ipc10.pt")},
                  train_per_class=50, test_size=300, preset=convnet_teacher_preset, preset_epochs=3,
                  teacher_recipe={"epochs": 2}, lr_select="none")
    lrs = _run(label_robust, **common, recipe={"epochs": 15}, real_recipe={"epochs": 2})
    row = lrs.per_seed.iloc[0]
    assert 0 <= row["lrs"] <= 100
    assert row["acc_syn_hard"] > 0.18  # the DC set trains a ConvNet well above chance (0.1) in 15 epochs
    ars = _run(augmentation_robust, **common)
    assert 0 <= ars.per_seed.iloc[0]["ars"] <= 100
