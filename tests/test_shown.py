"""What a user is shown is right: one unit per quantity on every surface, a set holding test images
never ranked, every protocol's board in the summary, the site and the card (issue 53, items 1-3)."""

from __future__ import annotations

import doctest
import io
import json
from contextlib import redirect_stdout

import numpy as np
import pandas as pd
import pytest

from ddlib.store import tracking

from ddlib.specs import units
from ddlib.cli import main as cli_main
from ddlib.protocols import protocol_module
from ddlib.protocols.cell import cell_tags
from ddlib.protocols.leakage import LEAKAGE_TAG
from ddlib.store.tracking import Tracker, default_tags


def use_store(monkeypatch, path):
    monkeypatch.setenv("DDLIB_MLRUNS", str(path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{path / 'mlflow.db'}")
    monkeypatch.setattr(tracking, "_CLIENTS", {})


# --------------------------------------------------------------------------- the table of units


@pytest.mark.parametrize("module", ["ddlib.specs.units", "ddlib.scores.tables"])
def test_the_units_modules_examples_hold(module):
    import importlib

    failed, tried = doctest.testmod(importlib.import_module(module))
    assert tried and not failed


# What the issue found shown wrong, and a few of each kind: (name as logged or shown, unit, scale).
PINNED = [
    ("cost.train_images.syn_hard", "images", 1), ("cost.train_seconds.syn_hard", "s", 1), ("cost.train_seconds", "s", 1),
    ("nll.syn_hard", "nats", 1), ("cost.train_seconds.model", "s", 1), ("pgd.queries", "count", 1),
    ("lr_real_hard", "lr", 1), ("models_trained", "count", 1), ("image_epochs_trained", "count", 1),
    ("hlr", "points", 100), ("ior_mean", "points", 100), ("lrs", "0-100", 1), ("lrs_mean", "0-100", 1),
    ("acc_syn_hard", "%", 100), ("per_seed/acc_syn_hard", "%", 100), ("test_accuracy", "%", 100),
    ("ece.syn_hard", "%", 100), ("class_acc_std.rdm_hard_std", "%", 100), ("worst_class_acc.syn-set", "%", 100),
    ("fgsm.robust_acc", "%", 100), ("transfer.fgsm.random", "%", 100), ("curve.fgsm.0.031373", "%", 100),
    ("loss_auc_set", "AUC", 1), ("shadow_auc_full_mean", "AUC", 1), ("loss_tpr_set", "%", 100),
    ("crei", "0-100", 1), ("rr_rome", "0-100", 1), ("spearman", "correlation", 1), ("top1", "%", 1),
    ("gt.arch000", "%", 1), ("compression_ratio", "ratio", 1), ("cost.test_flops.rdm_hard", "FLOPs", 1),
]


@pytest.mark.parametrize("name,unit,scale", PINNED, ids=[p[0] for p in PINNED])
def test_each_quantity_has_its_one_unit(name, unit, scale):
    found = units.unit_of(name)
    assert (found.name, found.scale) == (unit, scale) and units.explicit(name)


def test_a_value_and_its_shown_form_go_both_ways():
    assert units.shown("acc_syn_hard", 0.25) == 25.0 and units.computed("acc_syn_hard", 25.0) == 0.25
    assert units.shown("cost.train_images.syn_hard", 600) == 600  # a count is never scaled
    assert tracking.as_stored({"test_accuracy": 0.5733}) == {"test_accuracy": units.computed(
        "test_accuracy", units.shown("test_accuracy", 0.5733))}


# --------------------------------------------------------------------------- cells written by hand

BOARD_VALUES = {  # per protocol, the values its boards read (one seed's), for a clean set; a leaky one scores higher
    "label_robust": {"acc_syn_hard": 0.5, "acc_real_hard": 0.9, "acc_syn_any": 0.5, "acc_rdm_any": 0.3},
    "augmentation_robust": {"acc_syn_aug": 0.5, "acc_rdm_aug": 0.3, "acc_syn_noaug": 0.4, "acc_rdm_noaug": 0.3},
    "augmentation": {"acc_noaug": 0.5, "acc_aug_avg": 0.6, "acc_crop": 0.6},
    "compression": {"acc_set": 0.5, "acc_full": 0.9, "relative": 0.55},
    "privacy": {"loss_auc_set": 0.6, "shadow_auc_set": 0.6, "acc_set": 0.5},
}
NOTE = "leakage: 2 of 10 images are test images (2 exact, 0 near-duplicates)"
CLEAN, LEAKY = "kcenter", "dm"  # built-in methods' names (a cell's method needs a source)


def _cell(protocol: str, method: str, values: dict, seeds=(0, 1, 2), leak: bool = False, **params) -> str:
    """A FINISHED cell as a protocol logs it (its per-seed values, tags), written directly."""
    params = protocol_module(protocol).validate({"dataset": "digits", "method": method, "ipc": 1,
                                                 "seeds": list(seeds), **params})
    tracker = Tracker(protocol)
    run_id = tracker.start_run(method, params=params, tags={**default_tags(protocol), **cell_tags(protocol, params),
                                                            **({LEAKAGE_TAG: NOTE} if leak else {})})
    tracker.log_per_seed(run_id, [{"seed": s, **{k: v + 0.002 * s for k, v in values.items()}} for s in seeds])
    tracker.end_run(run_id)
    return run_id


@pytest.fixture
def leaky_and_clean(tmp_path, monkeypatch):
    """Per protocol a clean set (CLEAN) and a set holding test images (LEAKY) that scores better."""
    use_store(monkeypatch, tmp_path / "mlruns")
    tracking.init_store()
    for protocol, values in BOARD_VALUES.items():
        _cell(protocol, CLEAN, values)
        better = {k: v + 0.2 if not k.startswith(("acc_real", "acc_full", "acc_rdm")) else v for k, v in values.items()}
        _cell(protocol, LEAKY, better, leak=True)
    return tmp_path


def test_a_set_holding_test_images_is_never_ranked(leaky_and_clean):
    """On every ranked board the leaky set, though it scores higher, gets no rank, is listed below
    the ranked rows with the reason beside its rank, and the clean set is ranked first alone."""
    from ddlib.report.boards import build_board
    from ddlib.boards.rank import UNRANKED_LEAK
    from ddlib.boards.table import format_leaderboard

    for name in ("lrs", "ars", "augmentation", "compression"):
        board = build_board(name)
        assert list(board["method"]) == [CLEAN, LEAKY], name  # the leaky row last, though its score is higher
        leaky, clean = board.iloc[1], board.iloc[0]
        assert pd.isna(leaky["rank"]) and leaky["unranked"] == UNRANKED_LEAK and NOTE in leaky["sanity"], name
        assert clean["rank"] == 1 and clean["tied_with"] == "", name
        shown = format_leaderboard(board)
        assert list(shown["rank"]) == [1, UNRANKED_LEAK], name
        columns = list(shown.columns)
        assert columns.index("sanity") == columns.index("rank") + 1 or columns.index("sanity") == \
            columns.index("tied with") + 1, name


def test_a_leaky_set_is_flagged_in_the_card_the_site_and_the_bundle(leaky_and_clean):
    from ddlib.report import card as cards
    from ddlib.report.boards import load_boards
    from ddlib.report.bundle import write_bundle
    from ddlib.boards.rank import UNRANKED_LEAK
    from ddlib.report.site import build_site

    boards = load_boards()
    card = cards.build_card(LEAKY, "digits", 1, boards=boards)
    lrs = card.headline[card.headline["score"] == "LRS"].iloc[0]
    assert lrs["rank"] == UNRANKED_LEAK and NOTE in lrs["sanity"]
    assert UNRANKED_LEAK in cards._headline(card)

    assert build_site(leaky_and_clean / "site", with_cards=False)
    html = (leaky_and_clean / "site" / "lrs-digits-ipc1.html").read_text()
    headline = html.split('id="headline">')[1].split("</p>")[0]
    assert f"by <b>{CLEAN}</b>" in headline  # never the leaky set, though it scores higher
    assert UNRANKED_LEAK in html

    paths = write_bundle(leaky_and_clean / "bundle", boards)
    bundle = json.loads(paths["bundle"].read_text())
    flags = {(s["board"], s["row"]["method"]): (s["ranked"], s["flag"]) for s in bundle["sets"]}
    assert flags[("lrs", LEAKY)][0] is False and NOTE in flags[("lrs", LEAKY)][1]
    assert flags[("lrs", CLEAN)] == (True, "")
    rows = pd.read_csv(paths["ddranking"])
    assert {m: NOTE in f for m, f in zip(rows["method"], rows["flag"].fillna(""))} == {CLEAN: False, LEAKY: True}
    assert "units" in bundle and bundle["format"] == 2

    only = write_bundle(leaky_and_clean / "only", boards, methods=[CLEAN])
    assert {s["row"]["method"] for s in json.loads(only["bundle"].read_text())["sets"]} == {CLEAN}
    with pytest.raises(ValueError, match="--method nosuch"):
        write_bundle(leaky_and_clean / "none", boards, methods=["nosuch"])


def test_the_export_cli_limits_a_bundle_to_the_sets_named(leaky_and_clean):
    folder = leaky_and_clean / "cli-bundle"
    assert cli_main(["export", "--bundle", str(folder), "--method", CLEAN]) == 0
    assert {s["row"]["method"] for s in json.loads((folder / "bundle.json").read_text())["sets"]} == {CLEAN}


def test_a_quick_cell_says_so_on_the_boards(tmp_path, monkeypatch):
    """A cell of `ddlib score --quick` (tagged ddlib.quick) is a first look: its row's sanity says so."""
    from ddlib.report.boards import build_board
    from ddlib.boards.read import QUICK_NOTE

    use_store(monkeypatch, tmp_path / "mlruns")
    tracking.init_store()
    run_id = _cell("label_robust", CLEAN, BOARD_VALUES["label_robust"], seeds=(0,))
    tracking.client().set_tag(run_id, tracking.TAG["quick"], "quick look (...)")
    _cell("label_robust", LEAKY, BOARD_VALUES["label_robust"], seeds=(0,), recipe={"epochs": 7})
    board = build_board("lrs").set_index("method")
    assert board.loc[CLEAN, "sanity"] == QUICK_NOTE and board.loc[LEAKY, "sanity"] == ""


# --------------------------------------------------------------------------- every board everywhere


def test_the_summary_the_site_and_the_card_show_every_protocols_boards(tmp_path, monkeypatch):
    """Privacy and black-box cells appear in `ddlib summary`; the site's privacy page headlines the
    lowest AUC (lower is better) on 0-1; a set that was only the surrogate of a black-box cell has a
    black-box block on its card, not "not run"; a set file's card suggests `ddlib score --protocol`."""
    from ddlib.report import card as cards
    from ddlib.report.site import build_site

    use_store(monkeypatch, tmp_path / "mlruns")
    tracking.init_store()
    _cell("privacy", "kcenter", {"loss_auc_set": 0.58, "shadow_auc_set": 0.55, "acc_set": 0.6})
    _cell("privacy", "random", {"loss_auc_set": 0.52, "shadow_auc_set": 0.51, "acc_set": 0.5})
    # dm's models crafted the attacks; random's and kcenter's models were attacked (the targets)
    _cell("blackbox", "dm", {"clean_acc": 0.6, "clean.random": 0.5, "clean.kcenter": 0.55, "transfer.fgsm.random": 0.2,
                             "transfer.fgsm.kcenter": 0.25}, attacks=["fgsm"], target_models=["random", "kcenter"])
    _cell("label_robust", "dm", BOARD_VALUES["label_robust"])

    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["summary", "--no-log"]) == 0
    text = out.getvalue()
    assert "Privacy: membership inference" in text and "[privacy]" in text
    assert "BEARD black-box" in text and "[blackbox]" in text

    build_site(tmp_path / "site", with_cards=False)
    html = (tmp_path / "site" / "privacy-digits-ipc1.html").read_text()
    headline = html.split('id="headline">')[1].split("</p>")[0]
    assert "Lowest (lower is better)" in headline and "by <b>random</b>" in headline and "0.520" in headline

    card = cards.build_card("dm", "digits", 1)
    block = next(b for b in card.blocks if b.protocol == "blackbox")
    assert block.ran and "surrogate" in block.title
    line = card.headline[card.headline["protocol"].str.contains("black-box")].iloc[0]
    assert line["value"] != "not run" and "surrogate" in line["protocol"]


def test_a_set_files_card_suggests_ddlib_score_with_the_settings_used():
    from ddlib.report.card import run_command

    command = run_command("adversarial", "mine", "digits", 10, {"kind": "file", "path": "/sets/mine.npz",
                                                               "experiment_index": 0},
                          [0, 1], {"recipe": {"epochs": 30, "batch_size": 64}, "preset": None, "seeds": [0, 1]})
    assert command == ("python -m ddlib score /sets/mine.npz --dataset digits --protocol adversarial --method mine "
                       "--seeds 0 1 --experiment-index 0 --param 'recipe={\"epochs\": 30, \"batch_size\": 64}'")


# --------------------------------------------------------------------------- one unit on every surface


@pytest.mark.slow
def test_a_scored_set_shows_each_value_in_one_unit_on_every_surface(tmp_path, monkeypatch, capsys):
    """`ddlib score` on a 10-image digits set: its table, the numbers it writes as CSV, the MLflow run
    (means, per-seed steps, each model's child run), the bundle, the CSV export, the report card and
    the site show each value in one unit: counts as counts (10 images x 5 epochs = 50 images seen),
    learning rates as given, NLL in nats, accuracies in %, HLR in points. Why it takes about half a
    minute: a kernel start and imports, and 16 small trainings."""
    from sklearn.datasets import load_digits

    from ddlib.report import card as cards
    from ddlib.report.bundle import write_bundle
    from ddlib.report.export import export_tables

    use_store(monkeypatch, tmp_path / "mlruns")
    digits = load_digits()
    idx = [int(np.flatnonzero(digits.target == c)[5]) for c in range(10)]
    path = tmp_path / "mine.npz"
    np.savez(path, images=(digits.images[idx] / 16.0).astype("float32")[:, None], labels=digits.target[idx])
    args = ["score", str(path), "--dataset", "digits", "--seeds", "0", "1", "--quiet", "--param", "lr_policy=fixed",
            "--param", "recipe={epochs: 5, lr: 0.01}", "--param", "real_recipe={epochs: 1}"]
    assert cli_main(args) == 0
    shown = capsys.readouterr().out
    assert "LRS" in shown and "HLR" in shown and "more values: --columns all" in shown
    assert "cost.train_images" not in shown  # the short table: the scores and the accuracies they come from
    assert cli_main([*args, "--columns", "all", "--format", "csv"]) == 0
    table = pd.read_csv(io.StringIO(capsys.readouterr().out)).set_index("value")
    assert table.loc["cost.train_images.syn_hard", "mean"] == 50 and table.loc["cost.train_images.syn_hard", "unit"] == "images"
    assert table.loc["lr_syn_hard", "mean"] == pytest.approx(0.01) and table.loc["lr_syn_hard", "unit"] == "lr"
    assert 0 < table.loc["nll.syn_hard", "mean"] < 10 and table.loc["nll.syn_hard", "unit"] == "nats"
    assert 1 < table.loc["acc_real_hard", "mean"] <= 100 and table.loc["hlr", "unit"] == "points"

    cell = tracking.runs("label_robust", kind="cell").iloc[0]
    run = tracking.client().get_run(cell["run_id"])
    logged = run.data.metrics
    assert "lrs" not in logged and "hlr" not in logged  # the run page shows the means, not the last seed's value
    for value in ("hlr", "lrs", "acc_syn_hard", "cost.train_images.syn_hard", "nll.syn_hard"):
        assert logged[f"{value}_mean"] == pytest.approx(table.loc[value, "mean"]), value
        history = {m.step: m.value for m in tracking.client().get_metric_history(run.info.run_id, f"per_seed/{value}")}
        assert history == pytest.approx({0: table.loc[value, "seed 0"], 1: table.loc[value, "seed 1"]}), value
    syn = tracking.runs("label_robust", kind="eval")
    syn = syn[syn["tags.ddlib.role"] == "syn_hard"].sort_values("params.seed")
    assert list(syn["metrics.test_accuracy"]) == pytest.approx([table.loc["acc_syn_hard", "seed 0"],
                                                                table.loc["acc_syn_hard", "seed 1"]])

    paths = write_bundle(tmp_path / "bundle")
    (entry,) = [s for s in json.loads(paths["bundle"].read_text())["sets"] if s["board"] == "lrs"]
    assert entry["summary"]["hlr_mean"] == pytest.approx(table.loc["hlr", "mean"])
    assert [r["hlr"] for r in entry["runs"][0]["per_seed"]] == pytest.approx(
        [table.loc["hlr", "seed 0"], table.loc["hlr", "seed 1"]])
    exported = export_tables(formatted=False)["lrs"].iloc[0]
    assert exported["acc_syn_hard_mean"] == pytest.approx(table.loc["acc_syn_hard", "mean"])
    assert exported["train_images_mean"] == 50  # the images the set's models saw, as a count

    card = cards.build_card("mine", "digits", 1)
    lrs = next(b for b in card.blocks if b.protocol == "label_robust")
    column = lrs.tables[0][1].iloc[:, 0]
    hlr_label = next(i for i in column.index if i.startswith("HLR"))
    assert column[hlr_label].startswith(f"{table.loc['hlr', 'mean']:.2f}")


def test_a_row_of_an_earlier_revision_is_shown_but_never_ranked_nor_headlined(tmp_path, monkeypatch):
    """A cell computed under an earlier revision of its protocol (another definition: privacy's revision 2
    drew members that capped its AUC near 0.5) stays on the board, below the ranked rows with the reason
    beside its rank; the site's headline never names it, however it scores (issue 54 review)."""
    from ddlib.protocols.spec import get_spec
    from ddlib.report.boards import build_board
    from ddlib.boards.rank import UNRANKED_STALE
    from ddlib.report.site import build_site

    use_store(monkeypatch, tmp_path / "mlruns")
    tracking.init_store()
    _cell("label_robust", CLEAN, BOARD_VALUES["label_robust"])
    old = _cell("label_robust", LEAKY, {**BOARD_VALUES["label_robust"], "acc_syn_hard": 0.8, "acc_syn_any": 0.8})
    current = get_spec("label_robust").revision
    tracking.client().set_tag(old, tracking.TAG["revision"], str(current - 1))
    board = build_board("lrs")
    assert list(board["method"]) == [CLEAN, LEAKY]  # the earlier revision's row last, though it scores higher
    stale = board.iloc[1]
    assert pd.isna(stale["rank"]) and stale["unranked"] == UNRANKED_STALE.format(revision=current - 1, current=current)
    assert board.iloc[0]["rank"] == 1
    assert build_site(tmp_path / "site", with_cards=False)
    headline = (tmp_path / "site" / "lrs-digits-ipc1.html").read_text().split('id="headline">')[1].split("</p>")[0]
    assert f"by <b>{CLEAN}</b>" in headline
