"""Notebooks are committed without outputs, their parameters match the protocol, and they run."""

import contextlib
import json
import math
from pathlib import Path

import papermill as pm
import pytest

from ddlib.protocols import PROTOCOLS, protocol_module

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
ALL = sorted(NOTEBOOKS.glob("*.ipynb"))


def test_every_notebook_is_a_protocol_the_summary_or_the_report_card():
    assert {p.name for p in ALL} == {notebook for notebook, _ in PROTOCOLS.values()} | {"summary.ipynb", "report.ipynb"}


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    nb = json.loads(path.read_text())
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count"))]
    assert not dirty, f"{path.name}: cells {dirty} have outputs or execution counts; clear them before committing"


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_has_one_parameters_cell(path):
    nb = json.loads(path.read_text())
    tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_the_notebooks_parameters_cell_is_written_from_the_spec(protocol):
    """`python -m ddlib.protocols` writes it; papermill --help-notebook then shows every parameter's
    type and one-line help."""
    from ddlib.protocols.spec import get_spec, parameters_source

    spec = get_spec(protocol)
    nb = json.loads((NOTEBOOKS / spec.notebook).read_text())
    (cell,) = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert "".join(cell["source"]) == parameters_source(spec), "run: python -m ddlib.protocols"
    declared = pm.inspect_notebook(str(NOTEBOOKS / spec.notebook))
    for name, param in spec.params.items():
        assert declared[name]["help"] == param.help and declared[name]["inferred_type_name"] == param.type_name, name


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_protocol_notebook_parameters_match_the_protocol(protocol):
    notebook, _ = PROTOCOLS[protocol]
    declared = pm.inspect_notebook(str(NOTEBOOKS / notebook))
    module = protocol_module(protocol)
    assert set(declared) == set(module.PARAMS) | {"run_id", "experiment"}
    for name, default in module.PARAMS.items():  # the notebook's defaults are the protocol's
        assert eval(declared[name]["default"]) == default, name
    assert eval(declared["experiment"]["default"]) == protocol and eval(declared["run_id"]["default"]) is None


@pytest.mark.slow
def test_label_robust_notebook_runs_by_hand_then_summary_notebook(mlflow_store, tmp_path):
    """The label_robust notebook run by hand under papermill ends its own run; the summary notebook then
    shows and logs it. Why it takes about 20 s: two kernels' starts and imports (torch, MLflow) and a real
    K-Center cell at 1-2 epochs."""
    out = tmp_path / "lr.ipynb"
    pm.execute_notebook(str(NOTEBOOKS / "label_robust.ipynb"), str(out), kernel_name="python3", progress_bar=False,
                        parameters={"method": "kcenter", "ipc": 1, "seeds": [0], "recipe": {"epochs": 2},
                                    "real_recipe": {"epochs": 1}}, cwd=str(NOTEBOOKS))
    from ddlib.store import tracking
    cells = tracking.runs("label_robust", kind="cell")
    assert len(cells) == 1 and cells.iloc[0]["status"] == "FINISHED"  # the notebook ended its own run
    summary_out = tmp_path / "summary.ipynb"
    pm.execute_notebook(str(NOTEBOOKS / "summary.ipynb"), str(summary_out), kernel_name="python3",
                        progress_bar=False, cwd=str(NOTEBOOKS))
    text = summary_out.read_text()
    assert "kcenter" in text and "LRS" in text
    assert len(tracking.runs("summary")) == 1  # CSV/HTML/PNG logged as a summary run


TINY_RUNS = {  # every protocol notebook at a setting a CPU runs in seconds (digits, 1 seed, few epochs)
    "augmentation": {"method": "random", "ipc": 2, "seeds": [0], "recipe": {"epochs": 2}, "aug_epochs": 2,
                     "augmentations": ["none", "dsa", "imagenet_aug"]},
    "compression": {"method": "kcenter", "seeds": [0], "recipe": {"epochs": 2}, "aug_epochs": 2,
                    "real_recipe": {"epochs": 1}},
    "transfer": {"method": "random", "seeds": [0], "recipe": {"epochs": 2}, "aug_epochs": 2, "models": ["convnet", "mlp"]},
    "adversarial": {"method": "random", "ipc": 2, "recipe": {"epochs": 3}, "mode": "targeted",
                    "attacks": ["fgsm", "deepfool"], "attack_size": 40,
                    "eps_curve": {"attack": "fgsm", "eps": ["2/255", "4/255"]}},
    "blackbox": {"method": "random", "ipc": 2, "recipe": {"epochs": 3}, "attacks": ["fgsm", {"square": {"n_queries": 20}}],
                 "target_models": ["random", "kcenter"], "attack_size": 40},
}


NB201_SAMPLE = [  # six architectures with made-up accuracies, for when ../shared/data is absent
    ("|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|skip_connect~0|nor_conv_3x3~1|nor_conv_3x3~2|", 94.0),
    ("|avg_pool_3x3~0|+|nor_conv_1x1~0|skip_connect~1|+|nor_conv_1x1~0|skip_connect~1|skip_connect~2|", 90.0),
    ("|none~0|+|none~0|none~1|+|skip_connect~0|none~1|none~2|", 10.0),
    ("|nor_conv_1x1~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|none~0|nor_conv_1x1~1|avg_pool_3x3~2|", 85.0),
    ("|skip_connect~0|+|none~0|nor_conv_3x3~1|+|avg_pool_3x3~0|nor_conv_3x3~1|nor_conv_3x3~2|", 91.0),
    ("|nor_conv_3x3~0|+|none~0|none~1|+|none~0|none~1|nor_conv_1x1~2|", 70.0),
]


@pytest.mark.slow
def test_every_protocol_notebook_runs_then_the_summary_shows_them(mlflow_store, tmp_path, shared_data_or_none):
    """Every protocol notebook under papermill at a setting a CPU runs in seconds, then the summary
    notebook over them all. Why it takes a minute: nine notebook kernels, each starting and importing
    torch, ddlib and MLflow (about 5 CPU-s) before its few epochs; a kept kernel would hide a notebook
    that only works after another one."""
    runs = dict(TINY_RUNS)
    if shared_data_or_none is not None:  # NAS ranks against the real NAS-Bench-201 ground truth
        ground_truth = shared_data_or_none / "nasbench201-accuracy.csv"
    else:
        ground_truth = tmp_path / "nb201.csv"
        ground_truth.write_text("ArchitectureString,CIFAR10TestAccuracy200Epochs\n"
                                + "".join(f"{a},{acc}\n" for a, acc in NB201_SAMPLE))
    runs["nas"] = {"method": "random", "seeds": [0], "recipe": {"epochs": 2}, "num_archs": 5, "C": 4,
                   "ground_truth": str(ground_truth), "gt_column": "CIFAR10TestAccuracy200Epochs"}
    from ddlib.store import tracking
    for protocol, params in runs.items():
        notebook = PROTOCOLS[protocol][0]
        pm.execute_notebook(str(NOTEBOOKS / notebook), str(tmp_path / notebook), kernel_name="python3",
                            progress_bar=False, parameters=params, cwd=str(NOTEBOOKS))
        cells = tracking.runs(protocol, kind="cell")
        assert list(cells["status"]) == ["FINISHED"], protocol
    import sqlite3

    from ddlib.specs import units
    with contextlib.closing(sqlite3.connect(mlflow_store / "mlflow.db")) as db:  # every value has its one unit
        logged = {key for (key,) in db.execute("select distinct key from metrics")}
    assert not [k for k in logged if not units.explicit(k) and not k.startswith("system/")]
    out = tmp_path / "summary.ipynb"
    pm.execute_notebook(str(NOTEBOOKS / "summary.ipynb"), str(out), kernel_name="python3", progress_bar=False,
                        cwd=str(NOTEBOOKS))
    text = out.read_text()
    for shown in ("beard_unified", "RRM", "acc_aug_avg", "acc_set", "acc_reference", "spearman"):  # table contents
        assert shown in text, shown
    nas = tracking.runs("nas", kind="cell").iloc[0]  # the smoke run ranked 5 architectures and logged rho and tau
    assert math.isfinite(nas["metrics.spearman"]) and math.isfinite(nas["metrics.kendall"])
    assert len(tracking.runs("nas", kind="eval")) == 5
    logged = tracking.runs("summary")
    assert len(logged) == 1
    run_id = logged.iloc[0]["run_id"]
    artifacts = {a.path for a in tracking.client().list_artifacts(run_id)}
    assert {"beard.csv", "beard_unified.csv", "augmentation.csv", "compression.csv", "transfer.csv", "nas.csv",
            "beard_eps_curves.png", "compression.png"} <= artifacts
    import pandas as pd

    beard = pd.read_csv(tracking.client().download_artifacts(run_id, "beard.csv", str(tmp_path)))
    assert {"rr_mean", "ae_mean", "crei_mean", "rcr_mean", "fgsm.asr_mean", "fgsm.asr_beard_mean"} <= set(beard.columns)
    assert beard.loc[0, "mode"] == "targeted" and "deepfool.robust_acc_mean" not in beard  # skipped, never a value
