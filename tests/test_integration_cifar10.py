"""The DC-distilled CIFAR-10 IPC 10 set through LRS (DSA's evaluation) and soft-label ARS on real
CIFAR-10 (JPEG), CPU-sized."""

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
def test_lrs_and_soft_label_ars_on_dc_cifar10_ipc10(mlflow_store, shared_data, cifar10_jpeg_root, convnet_teacher_preset):
    """LRS under DSA's preset and ARS under a soft-label preset, end to end on the DC CIFAR-10 (JPEG) IPC 10
    set (50 training images per class, 300 test images). Why it takes about 25 s: a teacher, the sides of
    both protocols and the full-data reference, on 32x32 images, at 2-15 epochs each."""
    # ConvNet student for both presets (SRe2L's own is ResNet-18-BN); nothing searched, to fit a CPU
    common = dict(dataset="cifar10", data_root=str(cifar10_jpeg_root), method="dc", ipc=10, seeds=[0], model="convnet",
                  source={"kind": "file", "path": str(shared_data / "distilled" / "dc_cifar10_convnet_ipc10.pt")},
                  train_per_class=50, test_size=300, teacher_recipe={"epochs": 2}, lr_policy="fixed")
    lrs = _run(label_robust, **common, preset="dsa", preset_epochs=15, real_recipe={"epochs": 2})
    row = lrs.per_seed.iloc[0]
    # the hard side is DSA's own evaluation (DSA augmentation), HLR and IOR from that one accuracy
    assert lrs.sides.loc["syn_hard", "augment"].startswith("dsa(") and lrs.sides.loc["real_hard", "augment"] == "none"
    assert row["acc_syn_any"] == row["acc_syn_hard"] and row["ior"] == pytest.approx(row["acc_syn_hard"] - row["acc_rdm_hard"])
    assert row["acc_syn_hard"] > 18  # in %: the DC set trains a ConvNet well above chance (10 %) in 15 DSA epochs
    ars = _run(augmentation_robust, **common, preset=convnet_teacher_preset, preset_epochs=3)
    sides = ars.sides
    assert set(sides.index) == {"syn_aug", "rdm_aug", "syn_noaug", "rdm_noaug"}
    assert sides["loss"].str.startswith("relabel(1x").all() and sides["loss"].nunique() == 1  # one teacher for all
    assert sides.loc["syn_noaug", "augment"] == "none" and "cutmix" in sides.loc["syn_aug", "augment"]
    first = ars.per_seed.iloc[0]
    assert first["ior_aug"] == pytest.approx(first["acc_syn_aug"] - first["acc_rdm_aug"])
