"""A result's identity covers everything that defines it (issue 54, item 1): a revision bump
recomputes, other test or validation images or another ZCA fit are other inputs, other data at the
same data_root is another cell; the same inputs are still reused. Tiny CPU cases on digits."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import ddlib.specs.keys
import ddlib.protocols
from ddlib.store import tracking
from ddlib.data.datasets import load_dataset
from ddlib.engine.train import Recipe
from ddlib.protocols import label_robust
from ddlib.protocols.cell import Cell
from ddlib.store.tracking import TAG

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny trainings: a second thread only adds overhead

TINY = Recipe(epochs=2, batch_size=64, precision="fp32")
LRS = dict(dataset="digits", method="random7", source={"kind": "random", "seed": 7}, ipc=1, model="convnet",
           recipe={"epochs": 2}, real_recipe={"epochs": 1}, seeds=[0], lr_grid=[0.001, 0.01])


def _bump(monkeypatch, protocol: str = "label_robust") -> None:
    """The protocol's next revision, as the lead's bump of its spec gives it."""
    current = ddlib.protocols.protocol_revision
    monkeypatch.setattr(ddlib.protocols, "protocol_revision",
                        lambda name: current(name) + (name == protocol))


def _lrs_cell(**extra) -> dict:
    """One digits LRS cell run by hand; its run's metrics (models_trained, models_reused, searches)."""
    cell = label_robust.open_cell(**{**LRS, **extra})
    cell.progress = False
    label_robust.evaluate(cell, label_robust.obtain(cell))
    cell.close()
    return tracking.client().get_run(cell.run_id).data.metrics


def _cell(protocol: str = "label_robust", **params) -> Cell:
    return Cell.open(protocol, {"dataset": "digits", "model": "convnet", "seeds": [0], "device": "cpu", **params},
                     experiment="identity", progress=False)


# --------------------------------------------------------------------------- trained models (evaluation key)


def test_a_protocol_revision_bump_trains_every_model_again(mlflow_store, monkeypatch):
    """The issue's case: the same digits LRS cell under the protocol's next revision reused all 3
    models (models_reused 3, the same accuracies); now it trains them, and unchanged it reuses them."""
    first = _lrs_cell(lr_policy="fixed")
    assert first["models_trained"] == 3 and first["models_reused"] == 0
    again = _lrs_cell(lr_policy="fixed")
    assert again["models_trained"] == 0 and again["models_reused"] == 3  # reuse still works
    _bump(monkeypatch)
    bumped = _lrs_cell(lr_policy="fixed")
    assert bumped["models_trained"] == 3 and bumped["models_reused"] == 0


def test_the_engine_revision_is_in_every_evaluation_key(mlflow_store, monkeypatch):
    import ddlib.specs.keys

    cell = _cell()
    x, y = cell.dataset.train_images[:40], cell.dataset.train_labels[:40]
    (first,) = cell.train_eval("syn", x, y, TINY, [0])
    monkeypatch.setattr(ddlib.specs.keys, "ENGINE_REVISION", ddlib.specs.keys.ENGINE_REVISION + 1)
    (bumped,) = cell.train_eval("syn", x, y, TINY, [0])
    assert not first.reused and not bumped.reused and bumped.run_id != first.run_id


def test_other_test_images_with_the_same_labels_are_another_evaluation(mlflow_store):
    """The test side was keyed by the labels' digest (and name and path) only: JPEG replaced by PNG
    at the same path reused the old accuracies."""
    cell = _cell()
    ds = cell.dataset
    x, y = ds.train_images[:40], ds.train_labels[:40]
    (first,) = cell.train_eval("syn", x, y, TINY, [0])
    (same,) = cell.train_eval("syn", x, y, TINY, [0])
    assert not first.reused and same.reused and same.run_id == first.run_id
    cell.dataset = replace(ds, test_images=ds.test_images.flip(-1))  # other pixels, same labels, same path
    (other,) = cell.train_eval("syn", x, y, TINY, [0])
    assert not other.reused and other.run_id != first.run_id


def test_a_model_tested_on_other_validation_images_is_not_reused(mlflow_store):
    cell = _cell(val_fraction=0.1)
    x, y = cell.dataset.train_images[:40], cell.dataset.train_labels[:40]
    (first,) = cell.train_eval("syn", x, y, TINY, [0], eval_split="val")
    images, labels = cell.validation
    cell.validation = (images.flip(-1), labels)
    (other,) = cell.train_eval("syn", x, y, TINY, [0], eval_split="val")
    assert not first.reused and not other.reused


def test_the_zca_fit_is_part_of_the_key_of_what_it_whitens(mlflow_store, monkeypatch, tmp_path):
    """The ZCA was keyed by a constant name, though it is fitted on the cell's training images: the
    same set whitened by another fit reused the first fit's accuracy."""
    monkeypatch.setenv("DDLIB_CACHE", str(tmp_path / "cache"))
    a, b = _cell(), _cell()
    b.unsplit = replace(b.unsplit, train_images=b.unsplit.train_images.flip(-1))  # other training images: another fit
    x, y = a.dataset.train_images[:40], a.dataset.train_labels[:40]
    (first,) = a.train_eval("syn", x, y, TINY, [0], preprocess=a.zca())
    (same,) = _cell().train_eval("syn", x, y, TINY, [0], preprocess=_cell().zca())  # the same fit, from the cache
    (other,) = b.train_eval("syn", x, y, TINY, [0], preprocess=b.zca())
    assert not first.reused and same.reused and not other.reused
    run = tracking.client().get_run(other.run_id).data.params
    assert run["preprocess"].startswith("zca(eps=0.1")  # what it shows stays the readable name


# --------------------------------------------------------------------------- lr searches


def test_an_lr_search_is_redone_after_a_revision_bump_or_on_other_validation_images(mlflow_store, monkeypatch):
    """Both sides of a random7 cell search their lr on the validation split (2 searches); the same
    cell reuses both; the next revision, or other validation images with the same labels, search again."""
    import ddlib.protocols.cell as cell_module

    first = _lrs_cell()
    assert (first["lr_searches_run"], first["lr_searches_reused"]) == (2, 0)
    again = _lrs_cell()
    assert (again["lr_searches_run"], again["lr_searches_reused"]) == (0, 2)
    split = cell_module.hold_out_validation

    def other_pixels(dataset, fraction, seed=cell_module.VALIDATION_SEED):
        kept, (images, labels) = split(dataset, fraction, seed)
        return kept, (images.flip(-1), labels)

    with monkeypatch.context() as patch:
        patch.setattr(cell_module, "hold_out_validation", other_pixels)
        moved = _lrs_cell()
    assert (moved["lr_searches_run"], moved["lr_searches_reused"]) == (2, 0)
    _bump(monkeypatch)
    bumped = _lrs_cell()
    assert (bumped["lr_searches_run"], bumped["lr_searches_reused"]) == (2, 0)


# --------------------------------------------------------------------------- teachers


def test_a_teacher_is_trained_again_after_its_protocols_revision_bump(mlflow_store, monkeypatch):
    from ddlib.protocols.teachers import get_teachers, teacher_key

    digits = load_dataset("digits")
    get_teachers(digits, "convnet", 1, TINY, device="cpu", protocol="label_robust")
    get_teachers(digits, "convnet", 1, TINY, device="cpu", protocol="label_robust")
    assert len(tracking.runs("teachers")) == 1  # reused
    # ARS reuses LRS's teachers: one family, one definition
    assert (teacher_key(digits, "convnet", TINY, 0, protocol="augmentation_robust")
            == teacher_key(digits, "convnet", TINY, 0, protocol="label_robust"))
    _bump(monkeypatch)
    get_teachers(digits, "convnet", 1, TINY, device="cpu", protocol="label_robust")
    assert len(tracking.runs("teachers")) == 2


# --------------------------------------------------------------------------- cells and their data


def test_other_data_at_the_same_data_root_is_another_cell_and_row(monkeypatch):
    from ddlib.data import datasets
    from ddlib.protocols.placement import cell_tags

    params = label_robust.validate({"method": "random", "ipc": 1})
    before = cell_tags("label_robust", params)
    assert cell_tags("label_robust", params) == before
    digits = load_dataset("digits")
    png = replace(digits, test_images=digits.test_images.flip(-1))  # the same path, other pixels
    monkeypatch.setattr(datasets, "load_dataset", lambda name, root=None, download=False: png)
    after = cell_tags("label_robust", params)
    for key in ("config", "group", "series", "family"):
        assert before[TAG[key]] != after[TAG[key]], key
    assert before[TAG["engine_revision"]] == str(ddlib.specs.keys.ENGINE_REVISION)  # shown on every cell


# --------------------------------------------------------------------------- digests


def test_a_large_tensors_digest_is_computed_once_and_follows_in_place_changes(monkeypatch):
    from ddlib.data import digest

    images = torch.rand(600, 3, 16, 16)  # 1.8 MB: memoised
    labels = torch.arange(600)
    first = digest.tensor_digest(images, labels)
    calls = []
    monkeypatch.setattr(digest, "_digest", lambda tensors: calls.append(1) or "recomputed")
    assert digest.tensor_digest(images, labels) == first and not calls  # from the memo
    saved = images[0, 0, 0, 0].item()
    images[0, 0, 0, 0] += 1  # in place: its version counter moves
    assert digest.tensor_digest(images, labels) == "recomputed" and len(calls) == 1
    monkeypatch.undo()
    images[0, 0, 0, 0] = saved  # the first content again, a third version: hashed again, as the first time
    assert digest.tensor_digest(images, labels) == first == digest.tensor_digest(images.clone(), labels)
    assert digest.tensor_digest(images[1:], labels[1:]) != first
