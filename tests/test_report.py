"""Intervals and rank groups in the leaderboards, the report card, the static site, the MLflow UI.

One small store per module: three label-robust cells really trained on digits (random, K-Center,
DM at IPC 2; 3 seeds, a few epochs, 30 real images per class) and augmentation-robust cells written
directly with chosen per-seed accuracies, so that which methods tie is known in advance. Browser
tests open the pages in headless Chromium (tests/browser.py) and keep their screenshots under
``$DDLIB_SCREENSHOTS`` or the printed pytest temporary folder; they skip where Chromium is absent.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ddlib.store import tracking
from ddlib.protocols import augmentation_robust, label_robust
from ddlib.protocols.cell import cell_tags
from ddlib.report import card as cards
from ddlib.report.boards import load_boards
from ddlib.boards.rank import aggregate
from ddlib.boards.table import format_leaderboard
from ddlib.store.tracking import TAG, Tracker, default_tags

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
TINY = dict(dataset="digits", ipc=2, seeds=[0, 1, 2], train_per_class=30, recipe={"epochs": 3},
            real_recipe={"epochs": 2}, lr_policy="fixed")  # no lr search: the report is tested, not the policy
SOURCES = {"random": None, "kcenter": {"kind": "kcenter", "epochs": 1},
           "dm": {"kind": "dm", "iterations": 5, "batch_real": 16}}
# ARS cells written directly: per seed (syn_aug, rdm_aug, syn_noaug, rdm_noaug). dm and kcenter are
# within noise of each other (dm ahead on two seeds, behind on one); random is far below both.
ARS_SEEDS = {
    "dm": [(0.80, 0.60, 0.70, 0.55), (0.74, 0.58, 0.69, 0.56), (0.78, 0.61, 0.72, 0.57)],
    "kcenter": [(0.77, 0.60, 0.70, 0.55), (0.76, 0.58, 0.68, 0.56), (0.75, 0.61, 0.71, 0.57)],
    "random": [(0.60, 0.60, 0.55, 0.55), (0.58, 0.58, 0.56, 0.56), (0.61, 0.61, 0.57, 0.57)],
}


def _write_cell(protocol: str, params: dict, rows: list[dict]) -> str:
    """A FINISHED cell run with per-seed histories, as Cell.record_per_seed logs them."""
    return _write_cell_into(protocol, protocol, params, rows)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The module's store (see the module docstring); yields its folder."""
    folder = tmp_path_factory.mktemp("report-store") / "mlruns"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DDLIB_MLRUNS", str(folder))
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{folder / 'mlflow.db'}")
        mp.setattr(tracking, "_CLIENTS", {})
        for method, source in SOURCES.items():
            cell = label_robust.open_cell(method=method, source=source, **TINY)
            label_robust.evaluate(cell, label_robust.obtain(cell))
            cell.close()
        for method, seeds in ARS_SEEDS.items():
            params = augmentation_robust.validate({"dataset": "digits", "method": method, "ipc": 2,
                                                   "seeds": [0, 1, 2]})
            _write_cell("augmentation_robust", params, [
                {"seed": s, "acc_syn_aug": a, "acc_rdm_aug": b, "acc_syn_noaug": c, "acc_rdm_noaug": d}
                for s, (a, b, c, d) in enumerate(seeds)])
        yield folder




# --------------------------------------------------------------------------- leaderboards: intervals, rank groups


def _per_seed(method: str, values, seeds=(0, 1, 2, 3, 4)) -> list[dict]:
    return [{"group": method, "series": method, "family": "f", "seed": s, "run_id": f"run-{method}", "dataset": "d",
             "ipc": 10, "method": method, "lrs": v} for s, v in zip(seeds, values)]


def test_aggregate_adds_intervals_rank_groups_and_per_seed_scores():
    spread = np.array([50.0, 70.0, 60.0, 80.0, 55.0])  # seed-to-seed spread >> the leads below
    df = pd.DataFrame(_per_seed("a", spread + 1.0) + _per_seed("b", spread) + _per_seed("c", spread[::-1] + 0.5)
                      + _per_seed("d", spread - 20.0))
    board = aggregate(df, ["lrs"], ("dataset", "ipc", "method"), descending="lrs").set_index("method")
    # three seeds: each seed drawn three times has probability 1/27 > 2.5 %, so the 95 % interval is
    # their range (stats' generator seed fixed)
    three = aggregate(pd.DataFrame(_per_seed("a", [50.0, 70.0, 60.0], seeds=(0, 1, 2))), ["lrs"],
                      ("dataset", "ipc", "method"), descending="lrs").iloc[0]
    assert (three["lrs_mean"], three["lrs_low"], three["lrs_high"]) == (60.0, 50.0, 70.0)
    # five seeds: drawing one seed five times has probability 1/3125, so the interval lies strictly
    # inside the seeds' range (not their min and max)
    assert spread.min() + 1 < board.loc["a", "lrs_low"] < board.loc["a", "lrs_high"] < spread.max() + 1
    # a beats b by 1 on every seed: significant when paired by seed, though their intervals overlap widely
    assert board.loc["a", "lrs_low"] < board.loc["b", "lrs_high"]
    assert board.loc["a", "rank"] == 1 and board.loc["b", "rank"] == 2
    # c's lead over b varies by seed (-30 ... +30): tied with a and b; d is below all
    assert board.loc["c", "rank"] == 1 and set(board.loc["c", "tied_with"].split(", ")) == {"a", "b"}
    assert board.loc["d", "rank"] == 4 and board.loc["d", "tied_with"] == ""
    assert json.loads(board.loc["b", "lrs_per_seed"]) == {str(s): v for s, v in enumerate(spread)}
    assert board.loc["a", "runs"] == "run-a"
    shown = format_leaderboard(board.reset_index(), intervals=True)
    columns = list(shown.columns)
    assert columns[columns.index("seeds"):columns.index("seeds") + 3] == ["seeds", "rank", "tied with"]
    assert shown.set_index("method").loc["a", "LRS"].startswith("64.00 [")  # mean [low, high]


def test_rank_groups_stay_within_one_setting():
    df = pd.DataFrame(_per_seed("a", [1.0, 2, 3, 4, 5]) + _per_seed("b", [0.0, 1, 2, 3, 4]))
    df.loc[df["method"] == "b", "family"] = "other setting"
    board = aggregate(df, ["lrs"], ("dataset", "ipc", "method"), descending="lrs")
    assert list(board["rank"]) == [1, 1] and list(board["tied_with"]) == ["", ""]


def test_leaderboards_group_tied_methods(store):
    ars = load_boards()["ars"].set_index("method")
    assert list(ars["rank"].loc[["dm", "kcenter", "random"]]) == [1, 1, 3]
    assert ars.loc["dm", "tied_with"] == "kcenter" and ars.loc["random", "tied_with"] == ""
    # dm's ARS interval overlaps kcenter's, and both lie above random's
    assert ars.loc["dm", "ars_low"] < ars.loc["kcenter", "ars_high"]
    assert ars.loc["random", "ars_high"] < min(ars.loc["dm", "ars_low"], ars.loc["kcenter", "ars_low"])
    # ARS from the logged per-seed accuracies (gamma 0.5; no score was logged), the mean of the seeds'
    # scores as DD-Ranking's compute_metrics takes it. By hand: beta = 0.5 IOR_aug + 0.5 IOR_noaug =
    # 0.175, 0.145, 0.16 -> 100 (e^beta - e^-1) / (e - e^-1) = 35.0309, 33.5330, 34.2763 -> 34.2801
    # (the score of the mean accuracies would be 34.2763)
    assert ars.loc["dm", "ars_mean"] == pytest.approx(34.28006, abs=1e-5)


def test_every_board_keys_its_rows_by_precision_and_set(mlflow_store):
    """Issue 22, 2.5 and 2.6: a row never pools seeds trained in two precisions (bf16 on one machine,
    fp32 on another: newest won per seed) or cells that obtained two different sets (a built-in
    method whose code changed); DD-Ranking, DC-Bench and BEARD boards alike."""
    from ddlib.protocols import adversarial, compression
    from ddlib.protocols.cell import PRECISION_TAG
    from ddlib.protocols import beard_boards as beard, dcbench_boards as dcbench, ddranking_boards as ddranking

    SET_DIGEST_TAG = "ddlib.set_digest"  # what ddlib.protocols.common.obtain tags

    tracking.init_store()
    cases = {
        "label_robust": (label_robust.validate({"method": "dm", "ipc": 1, "seeds": [0]}),
                         {"acc_syn_hard": 0.5, "acc_real_hard": 0.9, "acc_syn_any": 0.5, "acc_rdm_any": 0.3},
                         lambda: ddranking.lrs_leaderboard()),
        "compression": (compression.validate({"method": "dm", "ipc": 1, "seeds": [0]}),
                        {"acc_set": 0.5, "acc_full": 0.9, "relative": 0.55}, lambda: dcbench.compression_leaderboard()),
        "adversarial": (adversarial.validate({"method": "dm", "ipc": 1, "seeds": [0], "attacks": ["fgsm"]}),
                        {"clean_acc": 0.5, "clean_seconds": 1.0, "fgsm.robust_acc": 0.2, "fgsm.attack_seconds": 2.0},
                        lambda: beard.robustness_leaderboard()),
    }
    for protocol, (params, values, board) in cases.items():
        tracker = Tracker(protocol)
        for precision, digest, shift in (("fp32", "set-a", 0.0), ("fp32", "set-a", 0.01), ("bf16", "set-a", 0.02),
                                         ("fp32", "set-b", 0.03)):
            run_id = tracker.start_run("cell", params=params, tags={**default_tags(protocol), **cell_tags(protocol, params),
                                                                  PRECISION_TAG: precision, SET_DIGEST_TAG: digest})
            tracker.log_per_seed(run_id, [{"seed": 0, **{k: v + shift for k, v in values.items()}}])
            tracker.end_run(run_id)
        rows = board()
        assert len(rows) == 3 and (rows["seeds"] == 1).all(), protocol  # the two fp32 set-a cells: one row
        first = sorted(values)[0]
        found = {(r["precision"], r["set"]): r[f"{first}_mean"] for _, r in rows.iterrows()}
        assert found == pytest.approx({("fp32", "set-a"): values[first] + 0.01, ("bf16", "set-a"): values[first] + 0.02,
                                       ("fp32", "set-b"): values[first] + 0.03}), protocol
    # the set is shown only where two rows differ by it alone; the precision always
    assert "precision" in format_leaderboard(ddranking.lrs_leaderboard()).columns


# --------------------------------------------------------------------------- the report card


def test_per_seed_values_read_in_bulk_are_mlflows_own_histories(mlflow_store, monkeypatch):
    """A SQL store's histories are read one query per metric (and BULK_RUNS runs), and give what
    MLflow's per-run get_metric_history gives: every seed, a seed logged twice at its last value,
    a per-seed metric only some runs have, a run with none of a key."""
    from ddlib.boards import read as core

    monkeypatch.setattr(core, "_HISTORIES", {})
    monkeypatch.setattr(core, "BULK_RUNS", 2)  # several chunks from five runs
    params = dict(dataset="digits", model="convnet", ipc=10)
    for i in range(5):
        rows = [{"seed": seed, "acc_syn_hard": 0.5 + i / 10 + seed / 100, "lrs": 0.1 * seed} for seed in range(3)]
        if i == 1:
            rows.append({"seed": 2, "acc_syn_hard": 0.99})  # logged again later: the last value wins
        if i == 3:
            rows = [{**row, "hlr": 0.3 + seed} for seed, row in enumerate(rows)]
        _write_cell("label_robust", {**params, "method": f"m{i}"}, rows)

    def read():
        return core.per_seed_values("label_robust", keys=["acc_syn_hard"], row_params=["method"],
                                    match=lambda k: k in ("lrs", "hlr")).sort_values(["method", "seed"])

    calls = []
    client = core.client()
    per_run = client.get_metric_history
    monkeypatch.setattr(type(client), "get_metric_history", lambda self, *a: calls.append(a) or per_run(*a))
    bulk = read()
    assert calls == []  # all from the bulk read
    monkeypatch.setattr(core, "_HISTORIES", {})
    monkeypatch.setattr(core, "_read_histories", lambda *a: None)
    one_by_one = read()
    assert len(calls) == 5 * 2 + 1  # acc_syn_hard and lrs of each run, hlr of one
    pd.testing.assert_frame_equal(bulk.reset_index(drop=True), one_by_one.reset_index(drop=True))
    assert len(bulk) == 15 and bulk.loc[bulk["method"] == "m1", "acc_syn_hard"].tolist()[-1] == 0.99
    assert bulk["hlr"].notna().sum() == 3


def test_report_card_has_every_section_and_logs_to_mlflow(store, tmp_path):
    card = cards.build_card("dm", "digits", 2)
    sections = {b.protocol: b for b in card.blocks}
    assert set(sections) == {"label_robust", "augmentation_robust", "adversarial", "blackbox", "augmentation",
                             "transfer", "compression", "nas", "privacy", "label_regimes"}
    assert sections["label_robust"].ran and sections["augmentation_robust"].ran
    for protocol in ("adversarial", "blackbox", "augmentation", "transfer", "compression", "nas"):
        assert not sections[protocol].ran
        assert sections[protocol].command.startswith("papermill notebooks/") and "-p method dm" in \
            sections[protocol].command and '"iterations": 5' in sections[protocol].command
    lrs_table = sections["label_robust"].tables[0][1]
    assert lrs_table.loc["seeds"].iloc[0] == "3" and "[" in lrs_table.loc["LRS (0-100)"].iloc[0]
    assert " of 3 (tied with: " in lrs_table.loc["rank on LRS"].iloc[0]
    ars_table = sections["augmentation_robust"].tables[0][1]
    assert ars_table.loc["rank on ARS"].iloc[0] == "1 of 3 (tied with: kcenter)"
    headline = card.headline.set_index("score")
    assert headline.loc["CREI", "value"] == "not run" and headline.loc["ARS", "rank"] == "1 of 3"
    assert card.image_grid.startswith(b"\x89PNG") and card.data == "digits"
    assert sections["label_robust"].config["method"] == "dm"
    for name in ("radar", "accuracy_vs_ipc", "training_loss", "confusion_matrix"):
        assert card.figures[name] is not None, name
    assert card.figures["robust_accuracy_vs_eps"] is None  # BEARD has not run
    path, run_id = cards.write_card(card, tmp_path / "dm.html")
    html = path.read_text()
    for text in ("Report card: dm, digits, IPC 2", "not run", "papermill notebooks/nas.ipynb", "rank on LRS",
                 "Confusion matrix", "sklearn.datasets.load_digits", sections["label_robust"].runs[0]):
        assert text in html, text
    assert html.count("data:image/png;base64,") >= 5  # self-contained: the images are inline
    client = tracking.client()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags[TAG["kind"]] == "report"
    logged = {a.path for a in client.list_artifacts(run_id)} | {a.path for a in client.list_artifacts(run_id, "plots")}
    assert {"report.html", "plots/radar.png", "plots/confusion_matrix.png", "plots/training_loss.png"} <= logged


def test_confusion_matrix_is_logged_at_evaluation_time(store):
    from ddlib.report import evals

    lrs = load_boards()["lrs"]
    cells = lrs[lrs["method"] == "kcenter"]["runs"].iloc[0].split()
    matrix, classes, models = evals.confusion_counts(cells, "syn_hard")
    assert models == 3 and classes == [str(c) for c in range(10)]
    counts = np.array(matrix)
    # the accuracy each seed logged is the matrix's trace over the test images
    accuracy = float(lrs[lrs["method"] == "kcenter"]["acc_syn_hard_mean"].iloc[0])
    assert np.trace(counts) / counts.sum() == pytest.approx(accuracy)
    names = sorted(r.info.run_name for r in evals.evaluation_runs(cells, "syn_hard"))
    assert names == ["syn_hard-s0", "syn_hard-s1", "syn_hard-s2"]
    assert len(evals.loss_curves(cells, "syn_hard")) == 3


def test_artifacts_of_a_local_store_are_read_in_place_as_mlflow_downloads_them(store, tmp_path, monkeypatch):
    """``artifact_bytes`` reads a local store's files where they lie: the bytes MLflow's download gives,
    None for a file the run does not have; an artifact URI not on this disk goes through MLflow."""
    from ddlib.report import evals

    lrs = load_boards()["lrs"]
    run = evals.evaluation_runs(lrs["runs"].iloc[0].split(), "syn_hard")[0]
    client = tracking.client()
    downloaded = Path(client.download_artifacts(run.info.run_id, "confusion.json", str(tmp_path))).read_bytes()
    assert evals.artifact_bytes(run, "confusion.json") == downloaded == evals.artifact_bytes(run.info.run_id, "confusion.json")
    assert evals.artifact_bytes(run, "no/such.json") is None
    assert evals._local_folder(run.info.artifact_uri) is not None
    for elsewhere in ("mlflow-artifacts:/1/abc/artifacts", "s3://bucket/x", "file:///no/such/folder", None):
        assert evals._local_folder(elsewhere) is None
    monkeypatch.setattr(evals, "_local_folder", lambda uri: None)  # as on a tracking server: MLflow downloads
    assert evals.artifact_bytes(run, "confusion.json") == downloaded
    assert evals.artifact_bytes(run, "no/such.json") is None


@pytest.fixture(scope="module")
def site(store, tmp_path_factory) -> Path:
    """The leaderboard site of the module's store, written by the CLI."""
    from ddlib.cli import main

    folder = tmp_path_factory.mktemp("site")
    assert main(["leaderboard", "--out", str(folder)]) == 0
    return folder


def test_cli_report(store, tmp_path, capsys):
    from ddlib.cli import main

    assert main(["report", "--method", "kcenter", "--out", str(tmp_path / "k.html"), "--no-log"]) == 0
    assert (tmp_path / "k.html").exists() and "not run: " in capsys.readouterr().out
    assert main(["report", "--method", "nope"]) == 1
    assert "methods with runs: ['dm', 'kcenter', 'random']" in capsys.readouterr().err


def test_cli_leaderboard_site(site):
    pages = {p.name for p in site.glob("*.html")}
    assert pages == {"index.html", "lrs-digits-ipc2.html", "ars-digits-ipc2.html"}
    assert {p.name for p in (site / "cards").glob("*.html")} == {"dm-ipc2-digits.html", "kcenter-ipc2-digits.html",
                                                                  "random-ipc2-digits.html"}
    csv = pd.read_csv(site / "ars-digits-ipc2.csv")
    assert {"ars_low", "ars_high", "rank", "tied_with", "ars_per_seed", "runs"} <= set(csv.columns)
    assert (site / "plots" / "lrs-digits-ipc2-scores.png").exists()


# --------------------------------------------------------------------------- in a browser


def test_site_and_card_render_in_chromium(site, browser, artifacts):
    images_ok = "Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)"
    browser.open((site / "index.html").as_uri(), images_ok)
    links = browser.evaluate("Array.from(document.querySelectorAll('a')).map(a => a.getAttribute('href'))")
    assert "ars-digits-ipc2.html" in links and "cards/dm-ipc2-digits.html" in links
    browser.screenshot(artifacts / "site-index.png")

    browser.open((site / "ars-digits-ipc2.html").as_uri(), images_ok)
    rows = browser.evaluate("Array.from(document.querySelectorAll('table.sortable')[0].tBodies[0].rows)"
                            ".map(r => Array.from(r.cells).map(c => c.innerText))")
    header = browser.evaluate("Array.from(document.querySelectorAll('table.sortable')[0].tHead.rows[0].cells)"
                              ".map(c => c.innerText.trim())")
    method, rank, ars = header.index("method"), header.index("rank"), header.index("ARS")
    assert [(r[method], r[rank]) for r in rows] == [("dm", "1"), ("kcenter", "1"), ("random", "3")]
    assert browser.evaluate("document.images.length") >= 1
    browser.evaluate(f"document.querySelectorAll('table.sortable th')[{ars}].click()")  # sort ascending by ARS
    assert [r[method] for r in browser.evaluate(
        "Array.from(document.querySelectorAll('table.sortable')[0].tBodies[0].rows)"
        ".map(r => Array.from(r.cells).map(c => c.innerText))")] == ["random", "kcenter", "dm"]
    browser.screenshot(artifacts / "site-ars-digits-ipc2.png")

    browser.open((site / "cards" / "dm-ipc2-digits.html").as_uri(), images_ok)
    text = browser.evaluate("document.body.innerText")
    for heading in ("DD-Ranking: Label-Robust Score", "BEARD: adversarial robustness", "DC-Bench: neural architecture",
                    "Confusion matrix of the model trained on the set", "Configuration and MLflow runs"):
        assert heading in text, heading
    assert text.count("not run") >= 5 and browser.evaluate("document.images.length") >= 5
    browser.screenshot(artifacts / "card-dm-ipc2-digits.png")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _mlflow_ui():
    """An ``mlflow server`` on the test store (in the environment ddlib gives its servers); yields its base URL."""
    from ddlib.store.server import mlflow_server_env

    mlflow = Path(sys.executable).with_name("mlflow")
    if not mlflow.exists():
        mlflow = shutil.which("mlflow")
    port = _free_port()
    server = subprocess.Popen([str(mlflow), "server", "--backend-store-uri", tracking.tracking_uri(), "--host",
                               "127.0.0.1", "--port", str(port), "--workers", "1"],
                              env=mlflow_server_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status == 200:
                    break
            except OSError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "mlflow server did not start"
            time.sleep(1)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its workers (its own process group)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)


@pytest.fixture(scope="module")
def mlflow_ui(store, chromium):
    """One ``mlflow server`` on the module's store for both UI tests (its start is about half of each);
    not started where the tests would skip for want of Chromium."""
    with _mlflow_ui() as base:
        yield base


def test_mlflow_ui_shows_cells_and_the_lrs_column(mlflow_ui, browser, artifacts):
    """MLflow's own UI on the module's store lists the label-robust cells and the lrs_mean column, as a
    training (not GenAI) experiment. Why it takes about 7 s (and the module's `mlflow server`, started in
    its setup, about as long: its imports and uvicorn worker until /health answers): MLflow's React UI
    loaded and rendered in headless Chromium until the cells and the column show; only the UI itself,
    served and rendered, shows what a user sees."""
    from ddlib.report.ui import ui_urls

    url = ui_urls(mlflow_ui)["label_robust"]
    cells = ["random-ipc2-convnet", "kcenter-ipc2-convnet", "dm-ipc2-convnet"]
    shown = " && ".join(f"document.body.innerText.includes('{c}')" for c in [*cells, "lrs_mean"])
    browser.open(url, shown, timeout=120)
    browser.screenshot(artifacts / "mlflow-ui-label_robust.png", full_page=False)
    text = browser.evaluate("document.body.innerText")
    assert "Model training" in text and "Runs" in text and "Token Usage" not in text  # training runs, not GenAI
    experiment = tracking.client().get_experiment_by_name("label_robust")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    # the README's search: cells by tag and param
    found = tracking.client().search_runs([experiment.experiment_id],
                                          "tags.protocol = 'label_robust' and params.ipc = '2'")
    assert sorted(r.info.run_name for r in found) == sorted(cells)


def test_mlflow_ui_shows_the_datasets_of_a_run(mlflow_ui, browser, artifacts):
    """Issue 27.6: a cell's run page lists the datasets its evaluations trained and were tested on
    (mlflow.data inputs: the distilled set, the random subsets, the full training set, the test set).
    Why it takes about 6 s: the run page rendered by MLflow's React UI (on the module's server) in
    headless Chromium and a full-page screenshot; the datasets' names and digests are read from the
    rendered page, as a user sees them."""
    experiment = tracking.client().get_experiment_by_name("label_robust")
    (run,) = tracking.client().search_runs([experiment.experiment_id], "attributes.run_name = 'dm-ipc2-convnet'")
    assert {i.tags[0].value for i in run.inputs.dataset_inputs} == {"distilled", "random", "train", "test"}
    digests = {i.dataset.digest: i.dataset.name for i in run.inputs.dataset_inputs}
    shown = r"/Datasets\ndigits [a-z0-9 ]+ \([0-9a-f]{24}\)/"  # the run page: its first dataset (name, digest)
    browser.open(f"{mlflow_ui}/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}",
                 f"{shown}.test(document.body.innerText)", timeout=120)
    browser.screenshot(artifacts / "mlflow-ui-run-datasets.png", full_page=True)
    text = browser.evaluate("document.body.innerText")
    name, digest = re.search(r"Datasets\n(digits [a-z0-9 ]+) \(([0-9a-f]{24})\)", text).groups()
    assert digests[digest] == name and f"+{len(run.inputs.dataset_inputs) - 1}" in text  # the others behind "+n"


# --------------------------------------------------------------------------- the notebook


@pytest.mark.slow
def test_report_notebook_runs_under_papermill(store, tmp_path):
    import papermill as pm

    out = tmp_path / "report.ipynb"
    pm.execute_notebook(str(ROOT / "notebooks" / "report.ipynb"), str(out), kernel_name="python3", progress_bar=False,
                        parameters={"method": "dm", "out": str(tmp_path / "dm.html")}, cwd=str(ROOT / "notebooks"))
    text = out.read_text()
    assert "image/png" in text and "not run" in text and "LRS (0-100)" in text
    assert (tmp_path / "dm.html").exists()


def test_a_method_with_two_rows_is_two_bars_and_two_names():
    """Scoring one set twice with other epochs (or two ddlib.score() calls, both "mine") gives one
    method two rows at one IPC: the summary's plots crashed on it; every row gets its own name and bar."""
    from ddlib.protocols import ddranking_boards as ddranking
    from ddlib.boards.rank import row_names

    board = pd.DataFrame({"dataset": ["digits"] * 3, "ipc": [2, 2, 2], "method": ["mine", "mine", "random"],
                          "config": ["b713db5b", "5cdee14f", "0f0f0f0f"], "lrs_mean": [27.0, 30.0, 20.0],
                          "lrs_std": [0.1, 0.2, 0.3]})
    assert row_names(board) == ["mine [b713db5b]", "mine [5cdee14f]", "random [0f0f0f0f]"]
    assert row_names(board.drop(columns="config")) == ["mine", "mine (2)", "random"]
    fig = ddranking.plot_scores(board, "lrs")
    bars = [patch.get_height() for patch in fig.axes[0].patches]
    assert sorted(bars) == [20.0, 27.0, 30.0]


def test_inside_one_read_a_board_is_built_once_per_weight_and_each_caller_gets_its_own_copy(monkeypatch):
    """The summary asks for the LRS board at each sweep weight twice (sweep table, rank stability):
    inside one_read each (board, weight) reads MLflow once; outside, every call reads again."""
    from ddlib.protocols import ddranking_boards as ddranking
    from ddlib.report.boards import build_board, one_read

    built = []

    def fake_lrs(experiment="label_robust", w=0.5):
        built.append(w)
        return pd.DataFrame({**{c: ["x"] for c in (*ddranking.row_params("lrs"), "revision")}, "lrs_mean": [w]})

    monkeypatch.setattr(ddranking, "lrs_leaderboard", fake_lrs)
    with one_read():
        first = build_board("lrs", w=0.3)
        first["added"] = 1  # a caller's column stays its own
        assert "added" not in build_board("lrs", w=0.3)
        sweep = ddranking.weight_sweep("lrs")
    assert built == [0.3, 0.1, 0.5, 0.7, 0.9] and list(sweep.columns)[-5:] == [f"lrs @ {v:g}" for v in ddranking.SWEEP]
    build_board("lrs", w=0.3)
    assert built[-1] == 0.3 and len(built) == 6


def _write_cell_into(experiment: str, protocol: str, params: dict, rows: list[dict]) -> str:
    """As :func:`_write_cell`, into any experiment (a grid's ``experiment:`` key)."""
    tracker = Tracker(experiment)
    run_id = tracker.start_run(f"{params['method']}-ipc{params['ipc']}", params=params,
                               tags={**default_tags(protocol), **cell_tags(protocol, params)})
    tracker.log_per_seed(run_id, rows)
    tracker.end_run(run_id)
    return run_id


def test_summary_names_cells_that_a_grids_experiment_key_keeps_off_the_boards(mlflow_store, capsys):
    """Cells filed under a grid's ``experiment:`` are on no board (each reads its protocol's own
    experiment): the summary says where they are instead of "no finished runs yet"."""
    from ddlib.cli import main

    params = dict(dataset="digits", model="convnet", ipc=10)
    rows = [{"seed": s, "acc_syn_hard": 0.9, "acc_real_hard": 0.98, "acc_syn_any": 0.9, "acc_rdm_any": 0.85}
            for s in range(2)]
    for method in ("dm", "random"):
        _write_cell_into("my_ablation", "label_robust", {**params, "method": method}, rows)
    assert main(["summary", "--no-log"]) == 1
    out = capsys.readouterr().out
    assert "no finished runs on the boards" in out and "'my_ablation' (2 cells)" in out
    _write_cell("label_robust", {**params, "method": "dm"}, rows)
    assert main(["summary", "--no-log"]) == 0
    out = capsys.readouterr().out
    assert "[lrs]" in out and "not on these boards: finished cells in experiment(s) 'my_ablation' (2 cells)" in out


def _lrs_rows(syn: float, second: float | None = None) -> list[dict]:
    """Two seeds; ``second``: seed 1's accuracy where it differs from seed 0's."""
    return [{"seed": s, "acc_syn_hard": v, "acc_real_hard": 0.98, "acc_syn_any": v, "acc_rdm_any": 0.85}
            for s, v in enumerate((syn, syn if second is None else second))]


def _ars_rows(syn: float) -> list[dict]:
    return [{"seed": s, "acc_syn_aug": syn, "acc_rdm_aug": 0.6, "acc_syn_noaug": syn, "acc_rdm_noaug": 0.55}
            for s in range(2)]


def test_boards_read_their_own_protocols_cells_from_the_experiment_named(mlflow_store, tmp_path, capsys):
    """``--experiment NAME`` builds every board from the cells a grid's ``experiment:`` key filed under
    NAME, each board from its own protocol's cells there (two protocols share the experiment); the
    protocols' own experiments are then the ones named as not on the boards. Without it, a cell of
    another protocol in a protocol's experiment is on no board, and said so."""
    from ddlib.cli import main
    from ddlib.report.boards import build_board, one_read
    from ddlib.boards.table import log_summary
    from ddlib.report.sources import boards_from

    params = dict(dataset="digits", model="convnet", ipc=10)
    for method, syn, second in (("dm", 0.9, 0.8), ("random", 0.7, 0.7)):
        _write_cell_into("my_ablation", "label_robust", {**params, "method": method}, _lrs_rows(syn, second))
        ars = augmentation_robust.validate({"dataset": "digits", "method": method, "ipc": 10, "seeds": [0, 1]})
        _write_cell_into("my_ablation", "augmentation_robust", ars, _ars_rows(syn))
    _write_cell("label_robust", {**params, "method": "dm"}, _lrs_rows(0.5))
    ars = augmentation_robust.validate({"dataset": "digits", "method": "kcenter", "ipc": 10, "seeds": [0, 1]})
    _write_cell_into("label_robust", "augmentation_robust", ars, _ars_rows(0.8))  # misfiled: on no board

    own = build_board("lrs", w=0.5)
    assert list(own["method"]) == ["dm"] and own["acc_syn_hard_mean"].iloc[0] == pytest.approx(0.5)
    assert build_board("ars", gamma=0.5).empty  # the ARS cell in label_robust's experiment is not read as ARS's
    with one_read():  # one board per experiment, even inside one read
        assert build_board("lrs", w=0.5)["method"].tolist() == ["dm"]
        with boards_from("my_ablation"):
            lrs, ars_board = build_board("lrs", w=0.5), build_board("ars", gamma=0.5)
            weighted = build_board("lrs", w=0.3)
            run_id = log_summary({})
    assert dict(zip(lrs["method"], lrs["acc_syn_hard_mean"])) == pytest.approx({"dm": 0.85, "random": 0.7})
    # LRS from the logged accuracies, by hand: alpha = w IOR - (1 - w) HLR per seed, then the mean of
    # the seeds' 100 (e^alpha - e^-1) / (e - e^-1). dm: HLR 0.08 and 0.18, IOR 0.05 and -0.05; random:
    # HLR 0.28, IOR -0.15. At w = 0.3 dm's alphas are -0.041 and -0.141 (the score of the mean
    # accuracies would be 23.19340, and w swapped with 1 - w 25.31795)
    assert dict(zip(lrs["method"], lrs["lrs_mean"])) == pytest.approx({"dm": 24.26647, "random": 18.66327}, abs=1e-5)
    assert dict(zip(weighted["method"], weighted["lrs_mean"])) == pytest.approx({"dm": 23.24197, "random": 17.78258},
                                                                               abs=1e-5)
    assert dict(zip(ars_board["method"], ars_board["acc_syn_aug_mean"])) == pytest.approx({"dm": 0.9, "random": 0.7})
    assert tracking.client().get_run(run_id).data.tags[TAG["boards_from"]] == "my_ablation"

    assert main(["summary", "--no-log"]) == 0
    out = capsys.readouterr().out
    assert "'label_robust' (1 cell)" in out and "'my_ablation' (4 cells)" in out  # the misfiled cell is named
    assert main(["summary", "--no-log", "--experiment", "my_ablation"]) == 0
    out = capsys.readouterr().out
    assert "boards of experiment 'my_ablation'" in out and "[lrs]" in out and "[ars]" in out
    assert "not on these boards: finished cells in experiment(s) 'label_robust' (2 cells)" in out
    assert main(["summary", "--no-log", "--experiment", "no_such"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--experiment: no finished cells of a protocol in MLflow experiment 'no_such'" in err
    assert "'my_ablation'" in err
    with pytest.raises(ValueError, match="experiment 'no_such'; experiments with"):  # the notebooks' and API's way in
        with boards_from("no_such"):
            pass
    assert main(["export", "--format", "csv", "--out", str(tmp_path / "own.csv"), "--board", "ars"]) == 1
    assert "'my_ablation' (4 cells)" in capsys.readouterr().err  # nothing on ARS's own board: says where cells are
    assert main(["export", "--experiment", "my_ablation", "--out", str(tmp_path / "ablation.csv")]) == 0
    assert set(pd.read_csv(tmp_path / "ablation.csv")["board"]) == {"lrs", "ars"}
    assert main(["leaderboard", "--experiment", "my_ablation", "--no-cards", "--out", str(tmp_path / "site")]) == 0
    assert "The boards of experiment <code>my_ablation</code>" in (tmp_path / "site" / "index.html").read_text()
    assert main(["export", "--experiment", "my_ablation", "--bundle", str(tmp_path / "bundle")]) == 0
    assert json.loads((tmp_path / "bundle" / "bundle.json").read_text())["boards_from"] == "my_ablation"
    assert main(["report", "--method", "dm", "--experiment", "my_ablation", "--no-log",
                 "--out", str(tmp_path / "dm.html")]) == 0
    page = (tmp_path / "dm.html").read_text()
    assert "Cells read from experiment <code>my_ablation</code>" in page and "-p experiment my_ablation" in page


def test_summary_notebook_reads_the_experiment_named(mlflow_store, tmp_path):
    """The summary notebook's ``experiment`` parameter is the CLI's ``--experiment``: its boards and
    its logged run come from that experiment's cells. Why it takes about 10 s: a notebook kernel's
    start and imports (torch, MLflow), then the summary's figures."""
    import papermill as pm

    params = dict(dataset="digits", model="convnet", ipc=10)
    for method, syn in (("dm", 0.9), ("random", 0.7)):
        _write_cell_into("my_ablation", "label_robust", {**params, "method": method}, _lrs_rows(syn))
    out = tmp_path / "summary.ipynb"
    pm.execute_notebook(str(ROOT / "notebooks" / "summary.ipynb"), str(out), kernel_name="python3", progress_bar=False,
                        parameters={"experiment": "my_ablation"}, cwd=str(ROOT / "notebooks"))
    assert "Label-Robust Score" in out.read_text()
    logged = tracking.runs("summary")
    assert len(logged) == 1 and logged.iloc[0][f"tags.{TAG['boards_from']}"] == "my_ablation"


def test_run_summary_reads_the_grids_own_experiment(mlflow_store, tmp_path, monkeypatch, capsys):
    """``ddlib run GRID --summary`` for a grid with an ``experiment:`` key summarises that experiment's
    boards, where its cells are."""
    from ddlib.run import runner
    from ddlib.cli import main

    _write_cell_into("my_ablation", "label_robust", dict(dataset="digits", model="convnet", ipc=10, method="dm"),
                     _lrs_rows(0.9))
    grid = tmp_path / "grid.yaml"
    grid.write_text("protocol: label_robust\nexperiment: my_ablation\nparams: {dataset: digits, ipc: 10}\n"
                    "grid: {method: [dm]}\n")
    monkeypatch.setattr(runner, "run_grid", lambda *a, **k: runner.RunReport())
    assert main(["run", str(grid), "--summary"]) == 0
    assert "boards of experiment 'my_ablation'" in capsys.readouterr().out
    grid.write_text(grid.read_text().replace("my_ablation", "running_elsewhere"))  # no finished cell there yet
    assert main(["run", str(grid), "--summary"]) == 2
    assert f"{grid}: experiment: no finished cells of a protocol in MLflow experiment 'running_elsewhere'" in (
        capsys.readouterr().err)


def test_cells_that_differ_only_by_their_score_weight_are_rows_that_say_so(mlflow_store):
    """Issue 54, 2.5: two LRS cells at w 0.5 and 0.9 (two ARS cells at gamma 0.5 and 0.9) are two rows with
    their weight in the row key, not two look-alike rows."""
    from ddlib.protocols.ddranking_boards import ars_leaderboard, lrs_leaderboard

    params = dict(dataset="digits", model="convnet", ipc=10, method="dm")
    for w in (0.5, 0.9):
        _write_cell("label_robust", {**params, "w": w}, _lrs_rows(0.9))
        _write_cell("augmentation_robust", {**params, "preset": "dsa", "gamma": w}, _ars_rows(0.8))
    assert sorted(lrs_leaderboard()["w"].astype(float)) == [0.5, 0.9]
    assert sorted(ars_leaderboard()["gamma"].astype(float)) == [0.5, 0.9]
