"""A newcomer's path (issue 53, section 5): the shipped grids found by name from any folder (a
``pip install`` has no ``params/``), a ``--like`` grid that cannot be scored named in its error, a
pixel-range hint that leads somewhere, and MLflow links that open what they promise: the runs table
with its Dataset column and a run's page in the model-training view, printed by ``ddlib run`` and
``ddlib runs --links``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from browser import threading_drain
from waiting import BOUND_SECONDS

from ddlib.store import tracking
from ddlib.cli import main as cli_main
from ddlib.run.runner import GridError, load_grid

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p.stem for p in (ROOT / "params").glob("*.yaml"))


# --------------------------------------------------------------------------- the shipped grids by name


def test_a_shipped_grid_is_found_by_name_from_any_folder(tmp_path, monkeypatch):
    """Outside the checkout `ddlib run params/demo.yaml` (as the docs write it), `demo.yaml` and `demo`
    all find the shipped grid; a file of that name in the current folder wins; anything else is one
    line listing the shipped names."""
    monkeypatch.chdir(tmp_path)
    for name in ("demo", "demo.yaml", "params/demo.yaml"):
        assert load_grid(name).path == ROOT / "params" / "demo.yaml", name
    mine = {"protocol": "label_robust", "params": {"dataset": "digits"}, "grid": {"method": ["random"], "ipc": [1]}}
    Path("demo.yaml").write_text(yaml.safe_dump(mine))
    assert load_grid("demo.yaml").path == Path("demo.yaml")  # the user's own file, not the shipped one
    with pytest.raises(GridError) as refused:
        load_grid("demoo")
    message = str(refused.value)
    assert "\n" not in message and message.startswith("demoo: no such file, and ddlib ships no grid of that name")
    assert message.endswith("shipped grids: " + ", ".join(SHIPPED))
    with pytest.raises(GridError, match=r"^other/demo.yaml: cannot read \(No such file"):
        load_grid("other/demo.yaml")  # a path into another folder is a path, not a name


def test_run_and_score_like_take_a_shipped_name(tmp_path, monkeypatch, capsys):
    from ddlib.scoring import like_grid

    monkeypatch.chdir(tmp_path)
    protocol, experiment, params = like_grid("demo", None, None)
    assert (protocol, experiment, params["dataset"]) == ("label_robust", "label_robust", "digits")
    assert cli_main(["run", "nosuch", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: nosuch: no such file, and ddlib ships no grid of that name; shipped grids: "), err
    assert "privacy_demo" in err.splitlines()[0]


def test_score_like_a_grid_of_a_protocol_without_sets_names_the_file():
    """`ddlib score --like params/dcbench_nas.yaml` said only "protocol must be one of [...], got 'nas'"."""
    from ddlib.scoring import like_grid

    nas = str(ROOT / "params" / "dcbench_nas.yaml")
    with pytest.raises(ValueError, match=rf"^--like {nas}: its protocol 'nas' does not score one set; --like takes a "
                                         r"grid of adversarial, augmentation, .*label_robust"):
        like_grid(nas, None, None)


# --------------------------------------------------------------------------- the pixel-range hint


def test_pixels_in_another_range_are_told_to_scale_them(tmp_path):
    """Digits' raw 0-16 pixels: the hint said "pass normalized=False", which then failed with "must
    lie near [0, 1]". Both messages now say to scale them (or store uint8)."""
    from ddlib.data.datasets import load_dataset
    from ddlib.data.distilled import DistilledSetError, load

    digits = load_dataset("digits")
    labels = digits.train_labels.numpy()
    idx = np.concatenate([np.flatnonzero(labels == c)[:2] for c in range(10)])
    path = tmp_path / "raw16.npz"
    np.savez(path, images=digits.train_images[idx].numpy() * 16, labels=labels[idx])
    messages = []
    for declared in ({}, {"normalized": False}):
        with pytest.raises(DistilledSetError) as refused:
            load(path, digits, **declared)
        messages.append(str(refused.value))
    for message in messages:
        assert message.startswith(f"{path}: read as pixels") and "span [0, 16]" in message, message
        assert "scale them to [0, 1] (0-255 values: store them as uint8, or divide by 255)" in message, message
        assert "pass normalized=False" not in message, message
    assert "normalized=True" in messages[0]  # the other reading of such values


# --------------------------------------------------------------------------- links into MLflow's UI


def _cell_with_datasets(name: str = "mine-ipc2-convnet") -> tuple[str, str]:
    """A FINISHED label-robust cell run that logged its datasets as the protocols do
    (:func:`ddlib.protocols.beyond.datasets`); returns (experiment id, run id)."""
    from ddlib.protocols.beyond import _dataset_input
    from ddlib.protocols.cell import cell_tags

    params = {"dataset": "digits", "method": "mine", "ipc": 2, "model": "convnet"}
    tracker = tracking.Tracker("label_robust")
    run_id = tracker.start_run(name, params=params, tags={**tracking.default_tags("label_robust"),
                                                          **cell_tags("label_robust", params)})
    tracker.log_per_seed(run_id, [{"seed": 0, "lrs": 30.0, "acc_syn_hard": 0.5}])
    tracker.log_metrics(run_id, {"lrs_mean": 30.0})
    images = np.zeros((20, 1, 8, 8), np.float32)
    tracker.log_inputs(run_id, [_dataset_input("digits mine ipc2", "a" * 24, "distilled", images, {"dataset": "digits"}),
                                _dataset_input("digits test", "b" * 24, "test", images, {"dataset": "digits"})])
    tracker.end_run(run_id)
    return tracker.experiment_id, run_id


def test_the_shared_view_selects_the_dataset_column(mlflow_store):
    """MLflow's runs table shows its Dataset column only where the view selects `attributes.`Dataset``
    (its default view does); ddlib's view listed its own columns without it."""
    from ddlib.report.ui import SHARED_VIEW_TAG, VIEW_KEY, install_views, run_url, runs_url

    experiment_id, run_id = _cell_with_datasets()
    assert install_views() == {"label_robust": experiment_id}
    view = json.loads(tracking.client().get_experiment(experiment_id).tags[SHARED_VIEW_TAG + VIEW_KEY])
    assert "attributes.`Dataset`" in view["selectedColumns"]
    assert {"params.`method`", "params.`ipc`", "metrics.`lrs_mean`"} <= set(view["selectedColumns"])
    for url in (runs_url("http://h:1/", experiment_id), run_url("http://h:1", experiment_id, run_id)):
        assert url.startswith(f"http://h:1/#/experiments/{experiment_id}/runs") and "workflowType=machine_learning" in url


def test_runs_links_prints_each_runs_page(mlflow_store, monkeypatch, capsys):
    from ddlib.report.ui import cell_link, run_url

    experiment_id, run_id = _cell_with_datasets()
    link = run_url("http://127.0.0.1:5000", experiment_id, run_id)
    assert cli_main(["runs", "--links"]) == 0
    assert link in capsys.readouterr().out  # whole, not cut at the table's column width
    assert cli_main(["runs"]) == 0
    assert "http://" not in capsys.readouterr().out
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5001/")  # a tracking server: its own pages
    assert cell_link(experiment_id, run_id) == run_url("http://tracking.example:5001", experiment_id, run_id)


def test_run_prints_each_finished_cells_link(mlflow_store, tmp_path, probe_notebooks, monkeypatch, capsys):
    from ddlib.report.ui import run_url

    monkeypatch.setenv("DDLIB_NOTEBOOKS", str(probe_notebooks))
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"protocol": "label_robust", "params": {"dataset": "digits", "seeds": [0]},
                                    "grid": {"method": ["random"], "ipc": [1]}}))
    assert cli_main(["run", str(grid)]) == 0
    out = capsys.readouterr().out
    experiment = tracking.client().get_experiment_by_name("label_robust")
    (run,) = tracking.client().search_runs([experiment.experiment_id], "attributes.run_name = 'random-ipc1-convnet'")
    assert f"finished random-ipc1-convnet: {run_url('http://127.0.0.1:5000', experiment.experiment_id, run.info.run_id)}" \
        in out.splitlines(), out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddlib_ui_links_open_the_dataset_column_and_the_training_view(mlflow_store, browser, artifacts, capsys):
    """In headless Chromium, the runs page `ddlib ui` prints shows the Dataset column with the cell's
    datasets, and the run page `ddlib runs --links` gives is MLflow's model-training view (its Runs
    and Models pages beside it), not the GenAI one (Observability, Evaluation runs, Prompts). Why it
    takes about 20 s: `ddlib ui` starts MLflow's UI on a new store (its imports and uvicorn worker until
    /health answers), and its React pages render in Chromium; only the UI itself shows what a user sees."""
    experiment_id, run_id = _cell_with_datasets()
    assert cli_main(["runs", "--links"]) == 0
    (link,) = [word for word in capsys.readouterr().out.split() if word.startswith("http://")]
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    ui = subprocess.Popen([sys.executable, "-m", "ddlib", "ui", "--port", str(port)], env=env, cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        printed = []
        for line in ui.stdout:  # the event: `ddlib ui` says its UI answers (after the runs pages)
            printed.append(line)
            if line.startswith("MLflow UI on"):
                break
        else:
            pytest.fail(f"`ddlib ui` exited ({ui.wait()}) before its UI answered: {''.join(printed)}")
        threading_drain(ui.stdout)  # MLflow's log goes on: a full pipe would block it
        base = f"http://127.0.0.1:{port}"
        (runs_page,) = [line.split(": ", 1)[1].strip() for line in printed if line.startswith("runs of label_robust: ")]
        headers = "Array.from(document.querySelectorAll('[role=columnheader]')).map(h => h.innerText.trim())"
        browser.open(runs_page, f"{headers}.includes('Dataset') && document.body.innerText.includes('digits mine ipc2')",
                     timeout=120)
        browser.screenshot(artifacts / "mlflow-ui-dataset-column.png", full_page=False)
        assert "Model training" in browser.evaluate("document.body.innerText")

        assert link.startswith("http://127.0.0.1:5000/")  # where `ddlib ui` serves by default; here on another port
        browser.open(link.replace("http://127.0.0.1:5000", base), "document.body.innerText.includes('Model metrics')",
                     timeout=120)
        browser.screenshot(artifacts / "mlflow-ui-run-page.png", full_page=False)
        text = browser.evaluate("document.body.innerText")
        assert run_id in text and "digits mine ipc2" in text
        lines = text.splitlines()
        assert {"Runs", "Models"} <= set(lines), text  # the training view's pages
        assert not {"Observability", "Evaluation runs", "Prompts"} & set(lines), text  # none of GenAI's
    finally:
        ui.send_signal(signal.SIGTERM)  # `ddlib ui` stops MLflow's UI with its workers
        try:
            ui.wait(BOUND_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait(BOUND_SECONDS)
