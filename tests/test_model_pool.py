"""The model pool (trained and released weights kept in MLflow), cached results, the full-data source, grid lists."""

import pytest
import torch
import yaml

from ddlib.store import tracking
from ddlib.data.datasets import load_dataset
from ddlib.protocols.cell import Cell
from ddlib.protocols.released import pool_checkpoints
from ddlib.run.runner import GridError, expand, load_grid
from ddlib.methods.sources import full_set, obtain_set, resolve_source
from ddlib.engine.train import Recipe

TINY = Recipe(epochs=2, batch_size=64)
PARAMS = {"dataset": "digits", "model": "convnet", "seeds": [0], "device": "cpu"}


def _cell(experiment="pool"):
    return Cell.open("pool", dict(PARAMS), experiment=experiment, progress=False)


def _predictions(model, images):
    with torch.no_grad():
        return model(images[:32]).argmax(1)


def test_models_are_stored_and_reused_from_another_cell(mlflow_store):
    first = _cell()
    ds = first.dataset
    x, y = ds.train_images[:100], ds.train_labels[:100]
    (trained,) = first.train_eval("syn", x, y, TINY, [0], keep_models=True)
    assert not trained.reused and trained.model is not None and not trained.model.training
    run = tracking.client().get_run(trained.run_id)
    assert run.data.tags["ddlib.model_stored"] == "true"

    second = _cell()
    (pooled,) = second.train_eval("syn", x, y, TINY, [0], keep_models=True)
    assert pooled.reused and pooled.run_id == trained.run_id and pooled.accuracy == trained.accuracy
    for (k, a), b in zip(trained.model.state_dict().items(), pooled.model.state_dict().values()):
        assert torch.equal(a, b), k
    norm = (ds.test_images - ds.mean[0]) / ds.std[0]
    assert torch.equal(_predictions(trained.model, norm), _predictions(pooled.model, norm))


def test_a_run_without_weights_is_retrained_when_the_model_is_needed(mlflow_store):
    cell = _cell()
    x, y = cell.dataset.train_images[:100], cell.dataset.train_labels[:100]
    (plain,) = cell.train_eval("syn", x, y, TINY, [0])
    assert plain.model is None
    (again,) = cell.train_eval("syn", x, y, TINY, [0])
    assert again.reused  # accuracy only: reused
    (stored,) = cell.train_eval("syn", x, y, TINY, [0], keep_models=True)
    assert not stored.reused and stored.model is not None
    assert stored.accuracy == plain.accuracy  # same data, recipe and seed: the same model


def test_the_objective_is_part_of_the_reuse_key(mlflow_store):
    cell = _cell()
    x, y = cell.dataset.train_images[:50], cell.dataset.train_labels[:50]

    def objective(model, xb, yb, g):
        return torch.nn.functional.cross_entropy(model(xb), yb)

    (a,) = cell.train_eval("syn", x, y, TINY, [0])
    with pytest.raises(TypeError, match="no canonical name"):  # a hook carries the name it is keyed by
        cell.train_eval("syn", x, y, TINY, [0], objective=objective)
    objective.name = "ce-objective"
    (b,) = cell.train_eval("syn", x, y, TINY, [0], objective=objective)
    assert not b.reused and b.run_id != a.run_id
    assert b.accuracy == a.accuracy  # the same loss written as an objective trains the same model
    (c,) = cell.train_eval("syn", x, y, TINY, [0], objective=objective)
    assert c.reused and c.run_id == b.run_id


def test_the_reuse_key_comes_from_the_hook_itself(mlflow_store):
    """Hooks carry their canonical names (every parameter); a changed hook is a new key, however it
    was built, and the same hook built twice is one key."""
    from ddlib.engine.augment import create_augment

    cell = _cell()
    ds = cell.dataset
    x, y = ds.train_images[:50], ds.train_labels[:50]

    def augment(spec):
        return create_augment(spec, mean=ds.mean, std=ds.std, num_classes=ds.num_classes)

    (a,) = cell.train_eval("syn", x, y, TINY, [0], augment=augment({"flip": {"p": 0.5}}))
    (b,) = cell.train_eval("syn", x, y, TINY, [0], augment=augment("flip"))  # the default p: the same hook
    (c,) = cell.train_eval("syn", x, y, TINY, [0], augment=augment({"flip": {"p": 1.0}}))
    assert b.reused and b.run_id == a.run_id and not c.reused


@pytest.mark.filterwarnings("ignore:.*near chance")  # untrained weights: only their identity matters here
def test_checkpoints_are_pooled_by_their_weights_not_their_file(mlflow_store, tmp_path):
    from ddlib.models import create_model

    torch.manual_seed(0)
    torch.save(create_model("convnet", 1, 10, (8, 8)).state_dict(), tmp_path / "a.pth")
    torch.save({"state_dict": torch.load(tmp_path / "a.pth")}, tmp_path / "renamed_and_wrapped.pth")
    torch.save(create_model("convnet", 1, 10, (8, 8)).state_dict(), tmp_path / "b.pth")
    (first,) = pool_checkpoints(_cell(), "model", {0: str(tmp_path / "a.pth")}, "convnet")
    assert not first.reused and tracking.client().get_run(first.run_id).data.tags["ddlib.model_stored"] == "true"
    (same,) = pool_checkpoints(_cell(), "model", {0: str(tmp_path / "renamed_and_wrapped.pth")}, "convnet")
    assert same.reused and same.run_id == first.run_id and same.accuracy == first.accuracy
    (other,) = pool_checkpoints(_cell(), "model", {0: str(tmp_path / "b.pth")}, "convnet")
    assert not other.reused and other.run_id != first.run_id
    stored = _cell()._load_model(first.run_id, "convnet", None)  # the pool holds the weights themselves
    for k, v in torch.load(tmp_path / "a.pth").items():
        assert torch.equal(stored.state_dict()[k].cpu(), v), k


def test_cached_result_computes_once(mlflow_store):
    calls = []

    def compute():
        calls.append(1)
        return {"robust_acc": 0.25, "attack_seconds": 1.5}

    identity = {"model_run": "abc", "attack": "fgsm(eps=8/255)"}
    first, reused = _cell().cached_result("fgsm", identity, compute)
    assert (first, reused, len(calls)) == ({"robust_acc": 0.25, "attack_seconds": 1.5}, False, 1)
    second, reused = _cell().cached_result("fgsm", identity, compute)
    assert (second, reused, len(calls)) == (first, True, 1)
    _, reused = _cell().cached_result("fgsm", {**identity, "attack": "fgsm(eps=4/255)"}, compute)
    assert not reused and len(calls) == 2


def test_an_empty_result_is_refused_not_cached(mlflow_store):
    cell = _cell()
    with pytest.raises(ValueError, match="returned no result"):
        cell.cached_result("skipped", {"k": 2}, lambda: {})
    assert tracking.runs("pool", kind="result").empty


def test_a_failing_computation_fails_the_cell_and_caches_nothing(mlflow_store):
    cell = _cell()

    def broken():
        raise RuntimeError("attack diverged")

    with pytest.raises(RuntimeError):
        cell.cached_result("x", {"k": 1}, broken)
    assert tracking.client().get_run(cell.run_id).info.status == "FAILED"
    assert tracking.runs("pool", kind="result").empty


def test_full_source_is_the_whole_training_set():
    ds = load_dataset("digits")
    full = obtain_set("full", resolve_source("full"), ds, ipc=1)
    assert full.method == "full" and len(full) == len(ds.train_labels)
    assert full.images is ds.train_images and torch.equal(full.labels, ds.train_labels)
    assert full_set(ds).class_counts == torch.bincount(ds.train_labels).tolist()


def _write(tmp_path, grid):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


def test_a_list_of_grids_is_the_union_of_their_cells(tmp_path):
    grid = {"protocol": "compression", "params": {"dataset": "digits"},
            "grid": [{"method": ["random", "kcenter"], "ipc": [1, 2]}, {"method": ["random"], "ipc": [1, 5]}]}
    cells = expand(load_grid(_write(tmp_path, grid)))
    assert sorted((c["method"], c["ipc"]) for c in cells) == [
        ("kcenter", 1), ("kcenter", 2), ("random", 1), ("random", 2), ("random", 5)]  # (random, 1) once


def test_full_is_one_cell_whatever_ipc_the_grid_crosses_it_with(tmp_path):
    grid = {"protocol": "compression", "params": {"dataset": "digits"},
            "grid": {"method": ["random", "full"], "ipc": [1, 10]}}
    cells = expand(load_grid(_write(tmp_path, grid)))
    assert sorted((c["method"], c["ipc"]) for c in cells) == [("full", 0), ("random", 1), ("random", 10)]


def test_bad_grid_in_a_list_is_named(tmp_path):
    grid = {"protocol": "compression", "params": {"dataset": "digits"},
            "grid": [{"method": ["random"]}, {"ipc": 3}]}
    with pytest.raises(GridError, match=r"grid\[1\]\.ipc must be a non-empty list"):
        load_grid(_write(tmp_path, grid))


def test_path_params_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "cifar").mkdir(parents=True)  # a data_root that does not exist is refused
    grid = {"protocol": "nas", "params": {"dataset": "cifar10", "data_root": "data/cifar",
                                          "ground_truth": "gt/nb201.csv"},
            "grid": {"method": ["random"]}}
    (cell,) = expand(load_grid(_write(tmp_path, grid)))
    assert cell["data_root"] == str(tmp_path / "data" / "cifar")
    assert cell["ground_truth"] == str(tmp_path / "gt" / "nb201.csv")
