"""Leaderboard submissions (``ddlib export --bundle``) and published rows (``ddlib import``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import ddlib
from ddlib.store import tracking
from ddlib.cli import main as cli_main
from ddlib.report.bundle import DDRANKING_COLUMNS, published_table

# Two rows of DD-Ranking's leaderboard (CIFAR-10, hard labels, w = 0.5): HLR / IOR in points as the
# leaderboard shows them (tests/test_metrics.py: DC IPC1 52.66 / 12.40, MTT IPC10 23.73 / 30.90), LRS
# as the paper prints it (19.1, 28.4).
PUBLISHED = """method,dataset,ipc,model,label_type,hard_label_recovery_mean,improvement_over_random_mean,\
label_robust_score_mean,w,source
DC,CIFAR-10,1,ConvNet-3,hard,52.66,12.40,19.1,0.5,DD-Ranking leaderboard
MTT,CIFAR-10,10,ConvNet-3,hard,23.73,30.90,28.4,0.5,DD-Ranking leaderboard
"""


def use_store(monkeypatch, store: Path) -> Path:
    monkeypatch.setenv("DDLIB_MLRUNS", str(store))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store / 'mlflow.db'}")
    monkeypatch.setattr(tracking, "_CLIENTS", {})
    return store


def test_import_stores_published_rows_apart_and_summary_and_export_label_them(tmp_path, monkeypatch, capsys):
    use_store(monkeypatch, tmp_path / "store")
    rows = tmp_path / "ddranking.csv"
    rows.write_text(PUBLISHED)
    assert cli_main(["import", str(rows)]) == 0
    assert "imported 2 published row(s)" in capsys.readouterr().out
    assert cli_main(["import", str(rows)]) == 0  # the same rows again: nothing added
    assert "imported 0 published row(s)" in capsys.readouterr().out

    table = published_table()
    assert list(table["method"]) == ["DC", "MTT"] and set(table["source"]) == {"published"}
    assert set(table["reference"]) == {"DD-Ranking leaderboard"}
    dc = table.iloc[0]
    # stored in the boards' units: HLR and IOR as fractions, LRS 0-100
    assert (dc["hlr_mean"], dc["ior_mean"], dc["lrs_mean"]) == pytest.approx((0.5266, 0.124, 19.1))
    # runs of their own experiment, kind published: no leaderboard of measured cells reads them
    from ddlib.report.boards import load_boards

    boards = load_boards()
    assert boards["lrs"].empty
    found = tracking.client().get_experiment_by_name("published")
    runs = tracking.client().search_runs([found.experiment_id])
    assert {r.data.tags[tracking.TAG["kind"]] for r in runs} == {"published"} and len(runs) == 2

    assert cli_main(["summary", "--no-log"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if " DC " in x)  # HLR in points, at the summary's precision
    assert "Published rows (ddlib import)" in out and re.search(r"\b52\.(7|66)\b", line) and re.search(r"\b19\.10?\b", line)

    exported = tmp_path / "board.csv"
    assert cli_main(["export", "--format", "csv", "--out", str(exported)]) == 0
    board = pd.read_csv(exported)
    assert set(board["board"]) == {"published"} and set(board["source"]) == {"published"}
    markdown = tmp_path / "board.md"
    assert cli_main(["export", "--format", "markdown", "--out", str(markdown)]) == 0
    assert "## published" in markdown.read_text() and "| published | DD-Ranking leaderboard |" in markdown.read_text()


@pytest.mark.parametrize("text,message", [
    ("method,dataset,label_robust_score_mean\nDC,CIFAR-10,19.1\n", "missing column(s) ipc"),
    ("method,dataset,ipc\nDC,CIFAR-10,1\n", "no score column"),
    ("method,dataset,ipc,label_robust_score_mean\nDC,CIFAR-10,1,19.1\nDM,CIFAR-10,ten,20\n", "line 3: ipc must be"),
    ("method,dataset,ipc,label_robust_score_mean\nDC,CIFAR-10,1,high\n", "line 2: label_robust_score_mean is not a number"),
])
def test_import_refuses_bad_rows_in_one_line(tmp_path, monkeypatch, capsys, text, message):
    use_store(monkeypatch, tmp_path / "store")
    rows = tmp_path / "rows.csv"
    rows.write_text(text)
    assert cli_main(["import", str(rows)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {rows}: ") and message in err and "\n" not in err
    assert published_table().empty


def test_export_needs_out_or_bundle(tmp_path, monkeypatch, capsys):
    use_store(monkeypatch, tmp_path / "store")
    assert cli_main(["export"]) == 2
    assert "--out FILE" in capsys.readouterr().err
    assert cli_main(["export", "--bundle", str(tmp_path / "b")]) == 1  # nothing measured yet
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_bundle_holds_each_set_and_its_ddranking_row_and_reads_back_as_published(tmp_path, monkeypatch, capsys):
    """A scored digits set: the bundle names its digest, data label, config, per-seed values and code;
    ddranking.csv carries the board's numbers in DD-Ranking's columns and units; importing that file
    gives published rows with the same numbers, shown beside the measured row, not pooled into it."""
    use_store(monkeypatch, tmp_path / "store")
    from ddlib.data.datasets import load_dataset

    ds = load_dataset("digits")
    labels = ds.train_labels.numpy()
    idx = np.concatenate([np.flatnonzero(labels == c)[:2] for c in range(10)])
    result = ddlib.score(ds.train_images[idx].numpy(), labels[idx], dataset="digits", method="mine", seeds=[0, 1],
                         recipe={"epochs": 30, "batch_size": 64}, real_recipe={"epochs": 2}, lr_policy="fixed")
    run = tracking.client().get_run(result.run_id)

    folder = tmp_path / "bundle"
    assert cli_main(["export", "--bundle", str(folder)]) == 0
    bundle = json.loads((folder / "bundle.json").read_text())
    assert bundle["ddlib"]["version"] == ddlib.__version__ and bundle["ddlib"]["commit"] == tracking.git_commit()
    (entry,) = [s for s in bundle["sets"] if s["board"] == "lrs"]
    assert entry["set_digest"] == run.data.tags["ddlib.set_digest"] and entry["data"] == run.data.tags["ddlib.data"]
    assert entry["row"]["method"] == "mine" and entry["row"]["dataset"] == "digits" and entry["seeds"] == 2
    (cell,) = entry["runs"]
    assert cell["run_id"] == result.run_id and cell["config"]["recipe"] == {"epochs": 30, "batch_size": 64}
    assert cell["code"] == {"version": ddlib.__version__, "commit": run.data.tags["ddlib.git_commit"]}
    per_seed = pd.DataFrame(cell["per_seed"]).set_index("seed")
    expected = result.per_seed.set_index("seed")
    for column in ("acc_syn_hard", "acc_real_hard", "hlr", "ior", "lrs"):
        assert list(per_seed[column]) == pytest.approx(list(expected[column])), column
    assert entry["summary"]["lrs_mean"] == pytest.approx(result.summary["lrs_mean"])

    rows = pd.read_csv(folder / "ddranking.csv")
    assert list(rows.columns) == list(DDRANKING_COLUMNS)
    (row,) = rows.to_dict("records")
    assert row["label_type"] == "hard" and row["num_eval"] == 2 and row["w"] == 0.5 and row["source"] == "ddlib"
    # one unit everywhere: DD-Ranking's points are the API's and the CLI's (ddlib.specs.units)
    assert row["hard_label_recovery_mean"] == pytest.approx(result.summary["hlr_mean"])
    assert row["improvement_over_random_std"] == pytest.approx(result.summary["ior_std"])
    assert row["label_robust_score_mean"] == pytest.approx(result.summary["lrs_mean"])
    assert pd.isna(row["augmentation_robust_score_mean"])
    assert set(pd.read_csv(folder / "leaderboards.csv")["board"]) == {"lrs"}

    assert cli_main(["import", str(folder / "ddranking.csv"), "--reference", "my submission"]) == 0
    (published,) = published_table().to_dict("records")
    assert published["reference"] == "my submission" and published["lrs_mean"] == pytest.approx(result.summary["lrs_mean"])
    from ddlib.report.export import export_tables

    tables = export_tables(formatted=False)
    assert len(tables["lrs"]) == 1 and tables["lrs"]["seeds"].iloc[0] == 2  # the measured row, alone
    assert tables["published"]["hlr_mean"].iloc[0] == pytest.approx(result.summary["hlr_mean"])
    # issue 57, 3: the measured row now has a published value, which it reproduces (the same numbers)
    assert tables["lrs"]["verified"].tolist() == [True] and "LRS verified (within the tolerance)" in \
        tables["lrs"]["verified_by"].iloc[0]


def test_ddranking_rows_lead_with_the_leaderboard_spaces_columns():
    """Issue 54, 2.6: DD-Ranking's leaderboard space reads data.csv with method, verified, date, dataset,
    ipc, label_type, hlr, ior; ddranking.csv starts with exactly those, ddlib's columns after them.
    ``verified`` is false (a row ddlib computed is not one the space verified); a set holding test images
    says why in ``flag``."""
    from datetime import date

    from ddlib.report.bundle import ddranking_rows

    board = pd.DataFrame([
        {"method": "dm", "dataset": "cifar10", "ipc": 10, "model": "convnet", "preset": "dm", "seeds": 5,
         "hlr_mean": 31.5, "hlr_std": 0.4, "ior_mean": 12.25, "ior_std": 0.3, "lrs_mean": 24.1, "lrs_std": 0.2,
         "data": "CIFAR-10 (JPEG)", "sanity": np.nan},
        {"method": "leaky", "dataset": "cifar10", "ipc": 10, "model": "convnet", "preset": "sre2l", "seeds": 5,
         "hlr_mean": 1.0, "hlr_std": 0.1, "ior_mean": 40.0, "ior_std": 0.1, "lrs_mean": 70.0, "lrs_std": 0.1,
         "data": "CIFAR-10 (JPEG)", "sanity": "the set holds 12 test images"}])
    rows = ddranking_rows({"lrs": board})
    assert list(rows.columns[:8]) == ["method", "verified", "date", "dataset", "ipc", "label_type", "hlr", "ior"]
    dm, leaky = rows.to_dict("records")
    assert (dm["hlr"], dm["ior"], dm["label_type"], dm["verified"]) == (31.5, 12.25, "hard", False)
    assert not dm["flag"] and leaky["verified"] is False
    assert leaky["label_type"] == "soft" and leaky["flag"].startswith("the set holds")
    assert dm["date"] == date.today().isoformat() or re.fullmatch(r"\d{4}-\d{2}-\d{2}", dm["date"])


def test_the_leaderboard_spaces_own_csv_imports(tmp_path, monkeypatch):
    use_store(monkeypatch, tmp_path / "store")
    rows = tmp_path / "data.csv"
    rows.write_text("method,verified,date,dataset,ipc,label_type,hlr,ior\n"
                    "DC,True,2025-01-20,CIFAR-10,1,hard,52.66,12.40\n")
    assert cli_main(["import", str(rows)]) == 0
    (dc,) = published_table().to_dict("records")
    assert (dc["hlr_mean"], dc["ior_mean"]) == pytest.approx((0.5266, 0.124))  # points in, fractions stored
