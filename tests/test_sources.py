"""Source kinds are a registry (ddlib.methods.sources.SOURCES): the keys a spec may give, and their
types, are each kind's keyword-only parameters; obtain_set calls the kind's factory."""

from __future__ import annotations

import inspect

import pytest
import torch

from ddlib.data.datasets import load_dataset
from ddlib.data.distilled import DistilledSet
from ddlib.methods import sources
from ddlib.specs.registry import Registry

NONE = type(None)
# The table the keys were written in by hand before the registry (ddlib 70c8ab8, SOURCE_KINDS):
# validation must accept and refuse exactly what it did.
HAND_WRITTEN = {
    "random": {"seed": int},
    "kcenter": {"seed": int, "model": str, "epochs": int, "n_init": int},
    "kcenter_greedy": {"seed": int, "model": str, "epochs": int},
    # issue 27.4's coresets, added with the registry in place
    "herding": {"seed": int, "model": str, "epochs": int},
    "herding_dc": {"seed": int, "model": str, "epochs": int},  # issue 54.4: DC's herding as iCaRL
    "forgetting": {"seed": int, "model": str, "epochs": int},
    "el2n": {"seed": int, "model": str, "epochs": int, "num_models": int},  # "models" until 2026-11-28
    # issue 57.2's pruning baselines
    "aum": {"seed": int, "model": str, "epochs": int},
    "ccs": {"seed": int, "model": str, "score": str, "epochs": int, "num_models": int, "hard_cutoff": (int, float),
            "strata": int},
    "dm": {"iterations": int, "lr_img": (int, float), "momentum": (int, float), "batch_real": int,
           "model": str, "init": str, "init_epochs": int, "seed": int},
    # experiment_index was "experiment" until 2026-11-28 (renamed: RENAMED_KEYS, tested below)
    "file": {"path": str, "normalized": (bool, NONE), "allow_unequal": bool, "experiment_index": int,
             "zca_space": (bool, NONE), "trusted": bool},
    "full": {},
    "checkpoint": {"path": str, "model": str, "expected_accuracy": (int, float, str),  # str: "unknown" (issue 54)
                   "accuracy_tolerance": (int, float)},
}


def test_the_keys_of_every_kind_are_its_parameters_and_match_the_hand_written_table():
    assert sources.SOURCES.names() == sorted(HAND_WRITTEN)
    for kind, keys in HAND_WRITTEN.items():
        assert sources.source_keys(kind) == keys, kind
    assert sources.BUILTIN_SOURCES == {k: {"kind": k} for k in ("random", "kcenter", "kcenter_greedy", "herding",
                                                                          "herding_dc", "forgetting", "el2n", "aum",
                                                                          "ccs", "dm", "full")}
    assert sources.MODEL_KINDS == ("checkpoint",) and sources.BUILTIN_REVISIONS == {"kcenter": 3, "dm": 3, "kcenter_greedy": 2,
                                                                     "herding": 2, "forgetting": 2, "el2n": 2}
    assert sources.builtin_revision({"kind": "dm", "init": "kcenter"}) == "dm revision 3, kcenter revision 3"


def test_a_kind_s_defaults_are_those_of_the_code_it_runs():
    """The factories restate their implementation's defaults (so a spec's defaults are visible in one
    place); they must not drift apart."""
    from ddlib.data.distilled import load
    from ddlib.methods.dm import distribution_matching
    from ddlib.methods.coresets import el2n_subset, forgetting_subset, herding_dc_subset, herding_subset
    from ddlib.methods.pruning import aum_subset, ccs_subset
    from ddlib.methods.select import kcenter_greedy_subset, kcenter_subset, random_subset

    runs = {"random": random_subset, "kcenter": kcenter_subset, "kcenter_greedy": kcenter_greedy_subset,
            "herding": herding_subset, "herding_dc": herding_dc_subset, "forgetting": forgetting_subset, "el2n": el2n_subset,
            "aum": aum_subset, "ccs": ccs_subset,
            "dm": distribution_matching, "file": load}
    for kind, fn in runs.items():
        signature = inspect.signature(fn).parameters
        for key, default in sources.SOURCES.params(kind).items():
            if key != "path":  # the file's path has no default: the spec must give it
                assert signature[key].default == default, (kind, key)


def test_a_kind_registered_by_decorator_is_validated_from_its_parameters_and_obtained(monkeypatch):
    kinds = Registry("source kind")
    for name in sources.SOURCES:
        entry = sources.SOURCES.entry(name)
        kinds.add(name, entry.factory, **entry.meta)
    monkeypatch.setattr(sources, "SOURCES", kinds)

    @kinds.register("constant")
    def constant(req: sources.SetRequest, *, value: float = 0.5, tag: str | None = None) -> DistilledSet:
        labels = torch.arange(req.dataset.num_classes).repeat_interleave(req.ipc)
        images = torch.full((len(labels), *req.dataset.image_shape), float(value))
        return DistilledSet(images=images, labels=labels, num_classes=req.dataset.num_classes, method="constant")

    assert sources.source_keys("constant") == {"value": (int, float), "tag": (str, NONE)}
    spec = {"kind": "constant", "value": 1}
    assert sources.validate_source("c", spec) is spec  # returned as written: the config key sees what the user wrote
    out = sources.obtain_set("c", spec, load_dataset("digits"), 2)
    assert out.method == "c" and out.ipc == 2 and bool((out.images == 1).all())
    for bad, message in (({"value": "x"}, "value has the wrong type"),
                         ({"value": True}, r"value must be \(<class 'int'>, <class 'float'>\), got True"),
                         ({"valu": 1}, r"unknown key 'valu' for kind 'constant'; allowed: \['tag', 'value'\]")):
        with pytest.raises(ValueError, match=rf"method 'c': {message}"):
            sources.validate_source("c", {"kind": "constant", **bad})
    with pytest.raises(ValueError, match=r"kind must be one of \[.*'constant'.*\], got 'nope'"):
        sources.validate_source("c", {"kind": "nope"})


def test_specs_that_reuse_one_cached_computation_name_the_same_shared_work():
    """The runner keeps cells that share work apart (ddlib.run.executors.next_job): K-Center at any IPC,
    and DM from K-Center images, train one feature network; DM from real or K-Center images embeds
    the same real batches, and so does DM from noise (its noise has a generator of its own); what costs
    nothing shares nothing."""
    shared = sources.shared_work
    features = shared({"kind": "kcenter", "epochs": 20})
    assert features and features == shared({"kind": "kcenter", "epochs": 20, "n_init": 3})  # n_init: k-means only
    assert features == shared({"kind": "herding", "epochs": 20}) == shared({"kind": "kcenter_greedy", "epochs": 20})
    assert not features & shared({"kind": "kcenter", "epochs": 1})
    assert not features & shared({"kind": "kcenter", "epochs": 20, "seed": 1})
    real_means = shared({"kind": "dm", "iterations": 200})
    from_kcenter = shared({"kind": "dm", "iterations": 200, "init": "kcenter", "init_epochs": 20, "lr_img": 10.0})
    assert real_means < from_kcenter and features < from_kcenter
    assert not real_means & shared({"kind": "dm", "iterations": 100})
    assert shared({"kind": "dm"}) == real_means and shared({"kind": "kcenter", "model": None}) == shared({"kind": "kcenter"})
    assert shared({"kind": "dm", "iterations": 200, "init": "noise"}) == real_means
    for alone in ({"kind": "random"}, {"kind": "file", "path": "x.pt"}, {"kind": "full"},
                  {"kind": "no such kind"}, {"kind": [1]}, {"iterations": 200}, None):
        assert shared(alone) == frozenset()


def test_specs_naming_the_same_shared_work_do_reuse_one_cache(tmp_path, monkeypatch):
    """What the tokens claim, on the caches themselves: K-Center at IPC 1 trains the feature network,
    herding at IPC 2 and DM from K-Center images read it; DM from K-Center images writes the real means
    that DM from real images, and then DM from noise, read (no new cache file)."""
    monkeypatch.setenv("DDLIB_CACHE", str(tmp_path))
    ds = load_dataset("digits")
    files = lambda: sorted(p.name for p in (tmp_path / "features").iterdir() if "-dm-set-" not in p.name)  # noqa: E731 (the sets themselves: test_select_distill)
    kcenter = {"kind": "kcenter", "epochs": 1}
    dm_kcenter = {"kind": "dm", "iterations": 3, "init": "kcenter", "init_epochs": 1}
    dm_real, dm_noise = {"kind": "dm", "iterations": 3}, {"kind": "dm", "iterations": 3, "init": "noise"}
    shared = sources.shared_work
    assert shared(kcenter) <= shared(dm_kcenter) and shared(dm_real) < shared(dm_kcenter)
    assert sources.obtain_set("k", kcenter, ds, 1, device="cpu").provenance["feature_model_from"] == "trained"
    herding = sources.obtain_set("h", {"kind": "herding", "epochs": 1}, ds, 2, device="cpu")
    assert herding.provenance["feature_model_from"] == "cache"
    features = files()
    sources.obtain_set("d", dm_kcenter, ds, 1, device="cpu")
    means = files()
    assert len(means) == len(features) + 1
    sources.obtain_set("d", dm_real, ds, 2, device="cpu")
    assert files() == means
    sources.obtain_set("d", dm_noise, ds, 1, device="cpu")
    assert files() == means and sources.shared_work(dm_noise) == sources.shared_work(dm_real)


# The keys of a label_robust file cell of the bytes below with the DC file's first experiment, and of one of
# EL2N over two networks, as stored under the old names (first pinned at ddlib cfe153e and 5a5b696; every key
# changed with label_robust revision 6 and ddlib.specs.keys.ENGINE_REVISION 1, issue 54.1, and these are the keys
# since). The renames must keep finding them, and a key must not drift without a revision saying why.
STORED_KEYS = {"group": "0c599fb47655aee1", "series": "7ae9f88991746ad6", "family": "8e468044dfb5e78e"}
STORED_EL2N_KEYS = {"group": "b1439c5686974c0c", "series": "fe98810a94486147", "family": "8e468044dfb5e78e"}


def test_renamed_source_keys_keep_the_keys_of_their_old_names(tmp_path):
    """``experiment_index`` (which experiment of a DC-format file) was called ``experiment``, the name of a
    grid's MLflow experiment too; EL2N's ``num_models`` was ``models``, elsewhere a list of architectures.
    An old name is still read, with a FutureWarning, and renamed in the spec; giving both is refused; the
    cells' keys are those stored under the old names."""
    from ddlib.protocols.placement import cell_tags
    from ddlib.store.tracking import TAG

    path = tmp_path / "set.pt"
    path.write_bytes(b"a DC file's bytes")
    spec = {"kind": "file", "path": str(path), "experiment": 0}
    with pytest.warns(FutureWarning, match="method 'dsa': 'experiment' of kind 'file' is now 'experiment_index'"):
        assert sources.validate_source("dsa", spec) == {"kind": "file", "path": str(path), "experiment_index": 0}
    with pytest.raises(ValueError, match=r"method 'dsa': give 'experiment_index' only \('experiment' is its old name\)"):
        sources.validate_source("dsa", {"kind": "file", "path": "x.pt", "experiment": 0, "experiment_index": 0})
    cell = {"dataset": "digits", "method": "dsa", "ipc": 1, "seeds": [0, 1], "source": spec}
    tags = cell_tags("label_robust", cell)
    assert {k: tags[TAG[k]] for k in STORED_KEYS} == STORED_KEYS
    renamed = cell_tags("label_robust", {**cell, "source": {"kind": "file", "path": str(path), "experiment_index": 0}})
    assert {k: renamed[TAG[k]] for k in STORED_KEYS} == STORED_KEYS  # the new name is the same cell
    other = cell_tags("label_robust", {**cell, "source": {**spec, "experiment_index": 1}})
    assert other[TAG["group"]] != STORED_KEYS["group"]  # another experiment of the file is another row

    el2n = {"kind": "el2n", "epochs": 1, "models": 2}
    with pytest.warns(FutureWarning, match="method 'el2n': 'models' of kind 'el2n' is now 'num_models'"):
        assert sources.validate_source("el2n", el2n) == {"kind": "el2n", "epochs": 1, "num_models": 2}
    tags = cell_tags("label_robust", {**cell, "method": "el2n", "source": el2n})
    assert {k: tags[TAG[k]] for k in STORED_EL2N_KEYS} == STORED_EL2N_KEYS


@pytest.mark.slow
def test_a_grid_with_the_old_name_reuses_the_cell_scored_with_the_new_one(mlflow_store, tmp_path, monkeypatch, capsys):
    """End to end, in process: ``ddlib.score(path, experiment_index=0)`` scores the DC file's first
    experiment (not its last, the default); a grid that still says ``experiment: 0`` resolves to the same
    cell and finds it finished. About 5 s: one cell of two tiny trainings and a 1-epoch reference."""
    import ddlib
    from ddlib.cli import main as cli_main
    from ddlib.scoring import cell_result, resolve_cell

    monkeypatch.setenv("DDLIB_CACHE", str(tmp_path / "cache"))
    ds = load_dataset("digits")
    mean, std = ds.mean[0], ds.std[0]
    labels = ds.train_labels
    first = torch.cat([torch.nonzero(labels == c)[:1, 0] for c in range(10)])
    last = torch.cat([torch.nonzero(labels == c)[1:2, 0] for c in range(10)])
    path = tmp_path / "res_DC_digits_ConvNet_1ipc.pt"
    torch.save({"data": [[(ds.train_images[i].float() - mean) / std, labels[i]] for i in (first, last)]}, path)
    cheap = {"seeds": [0], "recipe": {"epochs": 2, "batch_size": 64}, "real_recipe": {"epochs": 1}, "lr_policy": "fixed"}

    result = ddlib.score(path=path, dataset="digits", experiment_index=0, **cheap)
    grid = {"protocol": "label_robust", "params": {"dataset": "digits", **cheap},
            "grid": {"method": [path.stem], "ipc": [1]},
            "methods": {path.stem: {"kind": "file", "path": str(path), "experiment": 0}}}
    with pytest.warns(FutureWarning, match="is now 'experiment_index'"):
        protocol, experiment, cell = resolve_cell(grid)
    assert cell["source"]["experiment_index"] == 0
    found = cell_result(protocol, experiment, cell)
    assert found is not None and found.run_id == result.run_id
    default = resolve_cell({**grid, "methods": {path.stem: {"kind": "file", "path": str(path)}}})[2]
    assert cell_result(protocol, experiment, default) is None  # the last experiment is another cell
    # `ddlib score --experiment-index 0` is that cell too (0 was once dropped as falsy: the last experiment)
    args = ["score", str(path), "--dataset", "digits", "--seeds", "0", "--param", "recipe={epochs: 2, batch_size: 64}",
            "--param", "real_recipe={epochs: 1}", "--param", "lr_policy=fixed", "--dry-run"]
    assert cli_main([*args, "--experiment-index", "0"]) == 0
    assert "would run 0, skip 1" in capsys.readouterr().out
    assert cli_main(args) == 0
    assert "would run 1, skip 0" in capsys.readouterr().out
