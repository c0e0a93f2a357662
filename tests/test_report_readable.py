"""Readable results (issue 24.11) on the site and the report card, checked on a small store and in
headless Chromium at 1400 x 900: the headline score comes first and is on screen without scrolling,
every row names its recipe and epochs, the caveats follow the row's own seeds (2 here, never "3"),
an IPC-1 set's images carry their class names and fit the screen, and the accuracy-against-IPC plot
shows the random baseline.

The store: label-robust cells really trained on digits with 2 seeds (DM at IPC 1 and 2, K-Center at
IPC 1; a few epochs, 30 real images per class); no ``random`` method, so the baseline on the plot can
only be the cells' own random subsets. Screenshots are kept under ``$DDLIB_SCREENSHOTS`` or the
printed pytest temporary folder.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from ddlib.store import tracking
from ddlib.protocols import label_robust
from ddlib.report import card as cards, evals, plots, viz
from ddlib.report.boards import load_boards

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = dict(dataset="digits", seeds=[0, 1], train_per_class=30, recipe={"epochs": 2}, real_recipe={"epochs": 1},
            lr_policy="fixed")
CELLS = (("dm", 1, {"kind": "dm", "iterations": 5, "batch_real": 16}), ("kcenter", 1, {"kind": "kcenter", "epochs": 1}),
         ("dm", 2, {"kind": "dm", "iterations": 5, "batch_real": 16}))
WIDTH, HEIGHT = 1400, 900
CIFAR10 = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("readable-store") / "mlruns"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DDLIB_MLRUNS", str(folder))
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{folder / 'mlflow.db'}")
        mp.setattr(tracking, "_CLIENTS", {})
        for method, ipc, source in CELLS:
            cell = label_robust.open_cell(method=method, source=source, ipc=ipc, **TINY)
            label_robust.evaluate(cell, label_robust.obtain(cell))
            cell.close()
        yield folder


@pytest.fixture(scope="module")
def site(store, tmp_path_factory) -> Path:
    from ddlib.cli import main

    folder = tmp_path_factory.mktemp("readable-site")
    assert main(["leaderboard", "--out", str(folder)]) == 0
    return folder


@pytest.fixture
def browser(browser):
    """The shared headless Chromium (conftest), at the width and height the checks are about."""
    browser.set_viewport(WIDTH, HEIGHT)
    return browser


def _card(method="dm", ipc=1):
    return cards.build_card(method, "digits", ipc)


# --------------------------------------------------------------------------- without a browser


def test_caveats_follow_the_rows_seeds(store):
    card = _card()
    html = cards.render_html(card)
    lrs = next(b for b in card.blocks if b.protocol == "label_robust")
    assert lrs.tables[0][1].loc["seeds"].iloc[0] == "2"
    assert "3 seeds" not in html and "3 seeds" not in lrs.tables[0][0]
    assert "2 seeds give only 3 distinct resamples" in lrs.tables[0][0]  # C(3, 2): {a,a}, {a,b}, {b,b}
    assert "2 seeds give only 3 distinct resamples" in html


def test_card_rows_show_their_recipe_and_epochs(store):
    card = _card()
    lrs = next(b for b in card.blocks if b.protocol == "label_robust").tables[0][1]
    assert lrs.loc["recipe"].iloc[0] == "epochs 2" and lrs.loc["epochs"].iloc[0] == "2"
    row = card.headline.set_index("score").loc["LRS"]
    assert (row["recipe"], row["epochs"]) == ("epochs 2", "2")


def test_the_set_json_records_class_names_and_the_grid(store):
    runs = load_boards()["lrs"].query("method == 'dm' and ipc == 1")["runs"].iloc[0].split()
    info = json.loads(evals.artifact_bytes(runs[0], "sets/distilled.json"))
    assert info["classes"] == [str(i) for i in range(10)]
    assert info["grid"] == {"rows": 10, "columns": 1, "tile": [8, 8], "padding": 2}


def test_an_ipc1_grid_is_labelled_with_its_classes(store, monkeypatch):
    drawn = []
    real = viz.set_grid

    def spy(tiles, names, title=""):
        fig = real(tiles, names, title)
        drawn.append((np.asarray(tiles).shape, [t.get_text() for t in fig.axes[0].texts], fig.get_size_inches()))
        return fig

    monkeypatch.setattr(viz, "set_grid", spy)
    card = _card()
    assert card.image_grid.startswith(b"\x89PNG") and "labelled with their classes" in card.image_note
    (shape, texts, inches), = drawn
    assert shape == (10, 1, 8, 8, 1)  # ten classes, one grey 8 x 8 image each, cut out of the logged grid
    assert texts == [str(i) for i in range(10)]
    assert inches[1] * 110 < HEIGHT / 2  # at the pages' dpi: one line of ten images


def test_cifar10_names_and_larger_ipcs_fit_a_screen():
    rng = np.random.default_rng(0)
    fig = viz.set_grid(rng.random((10, 1, 32, 32, 3)), CIFAR10)
    assert [t.get_text() for t in fig.axes[0].texts] == list(CIFAR10)
    assert fig.get_size_inches()[1] * 110 < HEIGHT
    fig = viz.set_grid(rng.random((100, 10, 32, 32, 3)), [f"c{i}" for i in range(100)])  # CIFAR-100, IPC 10 (capped)
    width, height = fig.get_size_inches() * 110
    assert height < HEIGHT and width < WIDTH and "first 20 of 100 classes" in fig.axes[0].get_title()
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[:2] == ["c0", "c1"] and len(labels) == 20


def test_accuracy_against_ipc_shows_the_random_baseline(store):
    card = _card()
    ax = card.figures["accuracy_vs_ipc"].axes[0]
    baseline, = [c for c in ax.containers if c.get_label() == plots.RANDOM_BASELINE]
    lrs = load_boards()["lrs"]
    own = lrs[lrs["method"] == "dm"].sort_values("ipc")
    assert [int(x) for x in baseline.lines[0].get_xdata()] == [1, 2]
    # no preset: the random side is trained once, on hard labels (acc_rdm_any is acc_rdm_hard)
    np.testing.assert_allclose(np.asarray(baseline.lines[0].get_ydata(), dtype=float), 100 * own["acc_rdm_any_mean"].to_numpy())
    assert baseline.has_yerr and own["acc_rdm_any_low"].notna().all()  # 2 seeds: an interval, drawn as error bars
    history = {name: sorted((m.step, m.value) for m in tracking.client().get_metric_history(
        own["runs"].iloc[0].split()[0], f"per_seed/{name}")) for name in ("acc_rdm_hard", "acc_rdm_any")}
    assert history["acc_rdm_hard"] == history["acc_rdm_any"] and len(history["acc_rdm_hard"]) == 2


# --------------------------------------------------------------------------- in a browser at 1400 x 900

IN_VIEW = """(function (selector) {
  var r = document.querySelector(selector).getBoundingClientRect();
  return {top: r.top, bottom: r.bottom, left: r.left, right: r.right, height: r.height,
          text: document.querySelector(selector).innerText};
})"""
IMAGES_OK = "Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)"


def _rect(browser, selector: str) -> dict:
    return browser.evaluate(f"{IN_VIEW}({json.dumps(selector)})")


def test_site_page_headline_and_recipe_in_the_first_screen(site, browser, artifacts):
    browser.open((site / "lrs-digits-ipc1.html").as_uri(), IMAGES_OK)
    assert browser.evaluate("[window.innerWidth, window.innerHeight, window.scrollY]") == [WIDTH, HEIGHT, 0]
    headline = _rect(browser, "#headline")
    assert headline["bottom"] <= HEIGHT and headline["right"] <= WIDTH
    assert "Best LRS:" in headline["text"] and "2 seeds" in headline["text"]
    assert re.search(r"by (dm|kcenter) \(epochs 2\)", headline["text"])
    header = browser.evaluate("Array.from(document.querySelector('table.sortable').tHead.rows[0].cells)"
                              ".map(c => c.innerText.trim())")
    assert header[:5] == ["card", "method", "recipe", "epochs", "LRS"]
    score = browser.evaluate("(function(){var r = document.querySelector('table.sortable').tHead.rows[0].cells[4]"
                             ".getBoundingClientRect(); return [r.bottom, r.right];})()")
    assert score[0] <= HEIGHT and score[1] <= WIDTH  # the score column: on screen, no scrolling either way
    rows = browser.evaluate("Array.from(document.querySelector('table.sortable').tBodies[0].rows)"
                            ".map(r => [r.cells[1].innerText, r.cells[2].innerText, r.cells[3].innerText])")
    assert sorted(rows) == [["dm", "epochs 2", "2"], ["kcenter", "epochs 2", "2"]]
    assert browser.evaluate("document.documentElement.scrollWidth") <= WIDTH  # wide tables scroll in their box
    browser.screenshot(artifacts / "readable-site-lrs-digits-ipc1.png", full_page=False)


def test_card_headline_first_and_ipc1_grid_on_one_screen(site, browser, artifacts):
    browser.open((site / "cards" / "dm-ipc1-digits.html").as_uri(), IMAGES_OK)
    headline = _rect(browser, "#headline")
    assert headline["bottom"] <= HEIGHT and headline["top"] < 200
    assert headline["text"].startswith("LRS ") and "2 seeds" in headline["text"]
    grid = _rect(browser, "img.setgrid")
    assert grid["height"] <= HEIGHT, grid  # an IPC-1 set of ten classes: one screen, not a 2,000-pixel strip
    browser.screenshot(artifacts / "readable-card-dm-ipc1-digits.png", full_page=False)
    browser.screenshot(artifacts / "readable-card-dm-ipc1-digits-full.png")


def test_a_logged_grid_is_cut_back_into_its_tiles(tmp_path):
    """Cells logged before sets/*.json carried the layout: the tiles are recovered from the PNG alone
    (one line per class, square tiles, 2-pixel padding: ddlib.data.distilled.grid_tensor)."""
    import torch

    from ddlib.data.distilled import DistilledSet, image_grid

    images = torch.rand(30, 3, 6, 6)
    ds = DistilledSet(images, torch.arange(10).repeat(3), 10)
    png = image_grid(ds, tmp_path / "grid.png").read_bytes()
    tiles = plots._grid_tiles(png, rows=10, columns=None, tile=None)
    assert tiles.shape == (10, 3, 6, 6, 3)
    expected = (images[ds.labels == 4][2].permute(1, 2, 0).numpy() * 255 + 0.5).astype(int) / 255  # save_image rounds
    np.testing.assert_allclose(tiles[4, 2], expected, atol=1 / 255)
    assert plots._grid_tiles(png, rows=7, columns=None, tile=None) is None  # not this layout: the PNG is shown as it is
