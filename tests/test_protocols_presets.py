"""The DD-Ranking protocols against their definition (issue 10): the hard-label side under the method's
own evaluation, the random side labelled as the distilled side, learned and searched learning rates,
ZCA-space sets, one real-data pool, a random subset per seed, the preset's student; and determinism
across processes. Tiny CPU settings on the embedded digits data."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddlib import report

from ddlib.store import tracking
from ddlib.engine.train import Recipe
from ddlib.protocols import augmentation_robust, label_robust
from ddlib.store.tracking import TAG

TINY = dict(dataset="digits", method="random7", source={"kind": "random", "seed": 7}, ipc=2, model="convnet",
            recipe={"epochs": 3}, real_recipe={"epochs": 1}, preset_epochs=3, teacher_recipe={"epochs": 2},
            lr_grid=[0.001, 0.01])
ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")  # many tiny trainings: a second thread only adds overhead


def _run(module, **params):
    cell = module.open_cell(**params)
    cell.progress = False
    result = module.evaluate(cell, module.obtain(cell))
    cell.close()
    return cell, result


def _evals(experiment: str):
    """Every evaluation (trained model) of the experiment: role, seed, params, as dicts."""
    runs = tracking.client().search_runs(
        [tracking.client().get_experiment_by_name(experiment).experiment_id],
        f"tags.`{TAG['kind']}` = 'eval'", max_results=10000)
    return [{**r.data.params, "role": r.data.tags[TAG["role"]], "seed": int(r.data.params["seed"]),
             "accuracy": r.data.metrics["test_accuracy"], "key": r.data.tags[TAG["eval_key"]]} for r in runs]


# --------------------------------------------------------------------------- items 1, 5, 6, 7


def test_hard_side_is_the_presets_evaluation_searched_per_seed_and_real_data_is_one_pool(mlflow_store):
    cell, result = _run(label_robust, **TINY, seeds=[0, 1], preset="dsa")
    evals = _evals("label_robust")
    final = {(e["role"], e["seed"]): e for e in evals if "-lr" not in e["role"]}
    # 1. the hard-label accuracies train under the method's own augmentation (DSA), not the grid's recipe
    for role in ("syn_hard", "rdm_hard"):
        for seed in (0, 1):
            assert final[(role, seed)]["augment"].startswith("dsa(strategy=color_crop_cutout_flip_scale_rotate")
            assert final[(role, seed)]["recipe.epochs"] == "3"  # the preset's recipe (epochs overridden)
    assert final[("real_hard", 0)]["augment"] == "none" and final[("real_hard", 0)]["recipe.epochs"] == "1"
    # a hard-label method: HLR and IOR come from one accuracy (no separate "any" training)
    assert (result.per_seed["acc_syn_any"] == result.per_seed["acc_syn_hard"]).all()
    assert not any(e["role"].startswith("syn_any") for e in evals)
    # 5. paper policy: hard-label accuracies searched per seed, scored on the validation split
    trials = {(e["role"], e["seed"]) for e in evals if "-lr" in e["role"]}
    assert trials == {(f"{side}_hard-lr{lr}-val", s) for side in ("syn", "rdm") for lr in ("0.001", "0.01")
                      for s in (0, 1)}
    assert all(e["eval_split"] == "val" for e in evals if "-lr" in e["role"])
    run = tracking.client().get_run(cell.run_id)
    for role in ("syn_hard", "rdm_hard"):
        tag = run.data.tags[f"ddlib.lr.{role}"]
        assert "seed 0:" in tag and "seed 1:" in tag and "searched on the validation split over 0.001, 0.01" in tag
        history = tracking.client().get_metric_history(cell.run_id, f"per_seed/lr_{role}")
        assert {m.step: m.value for m in history} == {s: float(final[(role, s)]["recipe.lr"]) for s in (0, 1)}
    assert run.data.tags["ddlib.lr.real_hard"].startswith("seed 0: 0.01 (real_recipe (never searched))")
    assert list(result.sides.index) == ["syn_hard", "rdm_hard", "real_hard"]
    # 7. a random subset per evaluation seed
    assert final[("rdm_hard", 0)]["train_digest"] != final[("rdm_hard", 1)]["train_digest"]
    # 6. one real-data pool: a cell without a preset (nothing searched) holds out the same validation split
    other, plain = _run(label_robust, **TINY, seeds=[0, 1], lr_policy="fixed")
    assert other.validation is not None and torch.equal(other.validation[1], cell.validation[1])
    tags = [tracking.client().get_run(c.run_id).data.tags for c in (cell, other)]
    assert tags[0]["ddlib.pool"] == tags[1]["ddlib.pool"] and "136 held out for validation" in tags[0]["ddlib.pool"]
    assert list(plain.per_seed["acc_real_hard"]) == list(result.per_seed["acc_real_hard"])  # identical, reused
    reals = [e for e in _evals("label_robust") if e["role"] == "real_hard"]
    assert len(reals) == 2  # trained once per seed, whatever the preset
    # 7. the same random subset in every cell at a given seed (here: with and without a preset)
    rdm_plain = {e["seed"]: e for e in _evals("label_robust") if e["role"] == "rdm_hard" and e["augment"] == "none"}
    assert {s: rdm_plain[s]["train_digest"] for s in (0, 1)} == {s: final[("rdm_hard", s)]["train_digest"] for s in (0, 1)}


# --------------------------------------------------------------------------- items 2, 3, 4


@pytest.fixture
def datm_set(tmp_path):
    """A DATM-style set (2 per class): stored soft labels (logits), a learned lr of 0.02 (not in the
    lr grid) and images saved whitened, as DATM run with --zca saves them; plus its pixels."""
    import kornia

    from ddlib.data.datasets import load_dataset

    ds = load_dataset("digits")
    idx = torch.cat([torch.nonzero(ds.train_labels == c).flatten()[:2] for c in range(10)])
    pixels, labels = ds.pixels()[idx], ds.train_labels[idx]
    # as DATM/MTT get_dataset(--zca) whiten: kornia's ZCA fitted on the whole training set's
    # ToTensor() pixels in [0, 1] (no normalisation), applied to the pixels
    zca = kornia.enhance.ZCAWhitening(eps=0.1, compute_inv=True).fit(ds.pixels().float())
    whitened = zca(pixels.float())
    logits = (torch.randn(len(labels), 10, generator=torch.Generator().manual_seed(0))
              + 4 * torch.nn.functional.one_hot(labels, 10))
    path = tmp_path / "datm_ipc2.pt"
    torch.save({"images": whitened, "labels": labels, "soft_labels": logits, "lr": torch.tensor(0.02)}, path)
    return {"kind": "file", "path": str(path), "zca_space": True}, pixels


def test_zca_space_set_is_turned_back_into_pixels_once(mlflow_store, datm_set):
    source, pixels = datm_set
    cell = label_robust.open_cell(**{**TINY, "method": "datm", "source": source}, seeds=[0], preset="datm")
    distilled = label_robust.obtain(cell)
    cell.close()
    # 4. the loader leaves the whitened values alone, the protocol inverts the whitening: back to pixels
    assert not distilled.zca_space and (distilled.images - pixels).abs().max() < 1e-4
    assert distilled.learned_lr == pytest.approx(0.02) and distilled.soft_labels is not None
    assert "inverted with ZCA" in tracking.client().get_run(cell.run_id).data.tags["ddlib.zca_space"]


def test_the_zca_is_fitted_once_per_machine_and_loaded_bit_for_bit(mlflow_store, tmp_path, monkeypatch):
    """A cell's ZCA (an SVD of the pixel covariance: 13 s for CIFAR-10 on 2 cores) is fitted once per
    machine and cached under $DDLIB_CACHE/features: the next cell loads the very tensors, without
    fitting; other training images get their own entry."""
    from ddlib.engine import augment

    monkeypatch.setenv("DDLIB_CACHE", str(tmp_path / "cache"))
    first = label_robust.open_cell(**TINY, seeds=[0])
    fitted = first.zca()
    first.close()
    entries = sorted((tmp_path / "cache" / "features").glob("digits-zca-*.pt"))
    assert len(entries) == 1
    fit_zca = augment.fit_zca
    monkeypatch.setattr(augment, "fit_zca", lambda *a, **k: pytest.fail("the ZCA was fitted again"))
    second = label_robust.open_cell(**TINY, seeds=[1])
    loaded = second.zca()
    pixels = second.dataset.pixels()[:20].float() / 255
    second.close()
    for name in ("mean_vector", "transform_matrix", "transform_inv"):
        assert torch.equal(getattr(fitted.whitening, name), getattr(loaded.whitening, name)), name
    assert torch.equal(fitted(pixels), loaded(pixels)) and torch.equal(fitted.inverse(pixels), loaded.inverse(pixels))
    monkeypatch.setattr(augment, "fit_zca", fit_zca)
    other = label_robust.open_cell(**{**TINY, "train_per_class": 50}, seeds=[0])
    other.zca()
    other.close()
    assert len(list((tmp_path / "cache" / "features").glob("digits-zca-*.pt"))) == 2


def test_stored_soft_labels_learned_lr_and_teacher_labels_for_the_random_side(mlflow_store, datm_set, monkeypatch):
    from ddlib.engine import train as engine_train

    source, pixels = datm_set
    stored = torch.load(source["path"], weights_only=True)["images"]
    fed = []  # (images the loop holds, batch indices, the model's input before augmentation)
    batch = engine_train._Loop.batch

    def spy(loop, idx, g):
        fed.append((loop.images, idx.cpu(), loop.normalize(engine_train.as_pixels(loop.images[idx])).detach().cpu()))
        return batch(loop, idx, g)

    monkeypatch.setattr(engine_train._Loop, "batch", spy)
    cell, result = _run(label_robust, **{**TINY, "method": "datm", "source": source}, seeds=[0], preset="datm")
    # what the student is fed (before DSA) is what the file stored: whiten(pixels(stored)) == stored,
    # as DATM and DD-Ranking feed the stored whitened images directly
    distilled_batches = [(idx, x) for images, idx, x in fed
                         if images.shape == pixels.shape and (images.float().cpu() - pixels).abs().max() < 1e-3]
    assert distilled_batches
    for idx, x in distilled_batches:
        assert (x - stored[idx]).abs().max() < 1e-3
    evals = _evals("label_robust")
    final = {e["role"]: e for e in evals if "-lr" not in e["role"]}
    searched = {e["role"].split("-lr")[0] for e in evals if "-lr" in e["role"]}
    # 3. the distilled set's own evaluation trains at the lr it ships (DD-Ranking's syn_lr), unsearched
    assert float(final["syn_any"]["recipe.lr"]) == pytest.approx(0.02) and "syn_any" not in searched
    tags = tracking.client().get_run(cell.run_id).data.tags
    assert tags["ddlib.lr.syn_any"] == "seed 0: 0.02 (learned lr shipped with the set (syn_lr))"
    # ... the random subset and the distilled set's hard-label accuracy are searched (paper policy);
    # the random subset's hard-label accuracy enters no score under a soft-label preset: not trained
    # (issue 22, 2.7: DD-Ranking's soft-label evaluator does not train it either)
    assert searched == {"rdm_any", "syn_hard"}
    assert not any(e["role"].startswith("rdm_hard") for e in evals)
    assert "acc_rdm_hard" not in result.per_seed and list(result.sides.index) == ["syn_hard", "real_hard", "syn_any",
                                                                                  "rdm_any"]
    # 2. the random side is trained on the teacher's soft labels with the same loss and temperature
    assert final["syn_any"]["loss"] == final["rdm_any"]["loss"] == "stored:sce(temperature=1.0)"
    assert result.sides.loc["rdm_any", "labels"].startswith("teacher logits (convnet), computed once")
    assert result.sides.loc["syn_any", "labels"] == "soft labels shipped with the set"
    artifacts = [a.path for a in tracking.client().list_artifacts(cell.run_id, "teacher_labels")]
    assert artifacts == ["teacher_labels/random_seed0.pt"]
    stored = torch.load(Path(tracking.client().download_artifacts(cell.run_id, artifacts[0])), weights_only=True)
    assert stored["logits"].shape == (20, 10) and len(tracking.runs("teachers")) == 1
    # both sides whitened once by the same ZCA; the hard side trains with DSA and ZCA, as DATM's use_aug_for_hard
    assert (final["syn_any"]["preprocess"] == final["rdm_any"]["preprocess"] == final["syn_hard"]["preprocess"]
            == "zca(eps=0.1, fitted on [0, 1] pixels of the whole training set)")
    assert final["syn_hard"]["augment"].startswith("dsa(") and final["syn_hard"]["loss"] == "ce"
    # issue 54, 2.2: the full-data reference whitened too, and under DATM's use_aug_for_hard with its DSA, as
    # DD-Ranking's soft-label evaluator trains its real side (tests/test_conformance_ddranking.py: the flow)
    assert final["real_hard"]["preprocess"] == final["syn_hard"]["preprocess"]
    assert final["real_hard"]["augment"] == final["syn_hard"]["augment"]


# --------------------------------------------------------------------------- issue 22: 2.2, 2.3, 2.4


def test_the_random_method_is_never_its_own_baseline(mlflow_store):
    """The built-in `random` method draws with seed 0; the baselines of seeds 0..4 must not be its set
    (drawn from the methods' own stream, seed 0's baseline was that very set: IOR 0 by construction),
    and not any method draw at the evaluation seed either."""
    from ddlib.methods.select import random_subset
    from ddlib.protocols.preset_eval import SideTrainer

    params = {**TINY, "method": "random", "source": None, "seeds": [0, 1, 2, 3, 4], "lr_policy": "fixed"}
    cell = label_robust.open_cell(**params)
    distilled = label_robust.obtain(cell)
    baselines = SideTrainer(cell).random_subsets(distilled.ipc, params["seeds"])
    again = SideTrainer(label_robust.open_cell(**params)).random_subsets(distilled.ipc, params["seeds"])
    cell.close()
    method = set(distilled.provenance["indices"])
    for seed, subset in baselines.items():
        drawn = set(subset.provenance["indices"])
        assert drawn != method and drawn != set(random_subset(cell.dataset, 2, seed).provenance["indices"])
        assert subset.provenance["indices"] == again[seed].provenance["indices"]  # one baseline per seed, every cell
        assert torch.bincount(subset.labels, minlength=10).tolist() == [2] * 10
    assert len({tuple(s.provenance["indices"]) for s in baselines.values()}) == 5


def test_the_presets_teacher_recipe_applies_and_the_grid_overrides_it(mlflow_store, tmp_path):
    """A preset's labels.teacher.recipe is how its teachers train; a key the grid's teacher_recipe
    names wins over it; the teacher run (its key holds the recipe) and the cell's tag say so."""
    import yaml

    from ddlib.protocols.preset_eval import SideTrainer, resolve_preset

    data = yaml.safe_load((ROOT / "params/methods/datm.yaml").read_text())
    data["labels"]["teacher"]["recipe"] = {"epochs": 5, "lr": 0.05, "batch_size": 64}
    path = tmp_path / "datm_teacher.yaml"
    path.write_text(yaml.safe_dump(data))
    preset = resolve_preset(str(path))
    cell = label_robust.open_cell(**{**TINY, "teacher_recipe": {"epochs": 1}}, seeds=[0], preset=str(path))
    cell.progress = False
    SideTrainer(cell)._teacher_hook(preset)
    cell.close()
    (teacher,) = tracking.runs("teachers").to_dict("records")
    assert (teacher["params.recipe.epochs"], teacher["params.recipe.lr"], teacher["params.recipe.batch_size"]) == (
        "1", "0.05", "64")
    assert "lr=0.05 (preset" in tracking.client().get_run(cell.run_id).data.tags["ddlib.teacher_recipe"]
    from ddlib.protocols.preset_eval import teacher_recipe

    recipe, note = teacher_recipe(preset, {"epochs": 1})
    assert (recipe.epochs, recipe.lr, recipe.batch_size) == (1, 0.05, 64)
    assert "epochs=1 (grid teacher_recipe, over the preset)" in note and "lr=0.05 (preset datm_teacher" in note
    assert teacher_recipe(preset, {})[0].epochs == 5 and teacher_recipe(None, {"lr": 0.2})[0].lr == 0.2


def test_the_full_data_reference_trains_on_the_whole_training_set(mlflow_store):
    """DD-Ranking's acc_real_hard trains on its dst_train, the whole training set: the validation
    split, on which nothing of that side is chosen, is part of it."""
    cell, result = _run(label_robust, **TINY, seeds=[0], lr_policy="fixed")
    (real,) = [e for e in _evals("label_robust") if e["role"] == "real_hard"]
    held = len(cell.validation[1])
    assert held == 136 and int(real["train_size"]) == len(cell.unsplit.train_labels) == len(cell.dataset.train_labels) + held
    assert result.sides.loc["real_hard", "set"].startswith(f"the whole real training set ({int(real['train_size'])} images")


def test_the_full_data_reference_trains_first_unless_another_cell_trains_it(mlflow_store, monkeypatch):
    """Every cell of the data needs the full-data reference, the grid's longest training: the first
    cell trains it right after the distilled set's hard-label side (a broken set fails there first);
    a cell that finds another training it (its lock held) does its own sides first and then waits,
    instead of idling from its start. Same numbers either way."""
    from ddlib.protocols import cell as cell_module

    def order():
        runs = tracking.client().search_runs([tracking.client().get_experiment_by_name("label_robust").experiment_id],
                                             f"tags.`{TAG['kind']}` = 'eval'", order_by=["attributes.start_time ASC"])
        return [r.data.tags[TAG["role"]] for r in runs], {r.data.tags[TAG["role"]]: r.data.metrics["test_accuracy"] for r in runs}

    _run(label_robust, **TINY, seeds=[0], lr_policy="fixed")
    first, accuracies = order()
    assert first == ["syn_hard", "real_hard", "rdm_hard"]
    real_lock = cell_module.file_lock
    with real_lock("taken") as held, real_lock("taken", wait=False) as also:  # flock: a second open file is refused
        assert held and not also
    with real_lock("taken", wait=False) as held:
        assert held

    @contextlib.contextmanager
    def held_by_another_cell(name, on_wait=None, wait=True):
        with contextlib.ExitStack() as stack:
            if not wait:  # another cell holds the lock it probes (the full-data reference's)
                stack.enter_context(real_lock(name))
            yield stack.enter_context(real_lock(name, on_wait, wait))

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{mlflow_store / 'other.db'}")
    monkeypatch.setattr(tracking, "_CLIENTS", {})
    monkeypatch.setattr(cell_module, "file_lock", held_by_another_cell)
    _, result = _run(label_robust, **TINY, seeds=[0], lr_policy="fixed")
    last, again = order()
    assert last == ["syn_hard", "rdm_hard", "real_hard"] and again == accuracies
    assert list(result.sides.index) == ["syn_hard", "rdm_hard", "real_hard"]  # the table's order stays


def test_a_builtin_method_that_makes_another_set_never_pools_with_its_old_cells(mlflow_store, monkeypatch):
    """Issue 22, 2.6: the cell's config (the runner's skip key) is known before its set exists; the
    obtained set's digest is tagged once it does and splits the leaderboard row, so a built-in method
    whose code came to produce another set (as when K-Center became k-means) gets a row of its own."""
    from ddlib.methods import select, sources
    from ddlib.protocols.cell import cell_tags

    params = {**TINY, "method": "random", "source": None, "seeds": [0], "lr_policy": "fixed"}
    old, _ = _run(label_robust, **params)
    draw = select.random_subset
    monkeypatch.setattr(select, "random_subset", lambda dataset, ipc, seed=0: draw(dataset, ipc, seed + 1))
    new, _ = _run(label_robust, **params)
    tags = [tracking.client().get_run(c.run_id).data.tags for c in (old, new)]
    assert tags[0][TAG["config"]] == tags[1][TAG["config"]]  # the same config ...
    assert tags[0]["ddlib.set_digest"] != tags[1]["ddlib.set_digest"]  # ... another set
    board = report.lrs_leaderboard()
    assert len(board) == 2 and (board["seeds"] == 1).all() and board["set"].nunique() == 2
    # a kind whose output changed says so in the config key (kcenter: 2), so reruns recompute it
    kcenter = label_robust.validate({**params, "method": "kcenter"})
    bumped = cell_tags("label_robust", kcenter)[TAG["config"]]
    monkeypatch.setattr(sources, "BUILTIN_REVISIONS", {})
    assert cell_tags("label_robust", kcenter)[TAG["config"]] != bumped
    assert cell_tags("label_robust", label_robust.validate(params))[TAG["config"]] == tags[0][TAG["config"]]


# --------------------------------------------------------------------------- item 5: the policy, side by side


def _setting(preset_name: str | None, hard: bool, own: bool):
    from ddlib.protocols.side_plan import SideSetting as Setting, resolve_preset

    preset = resolve_preset(preset_name)
    recipe = preset.recipe if preset is not None else Recipe(lr=0.03)
    return Setting("s", recipe, "convnet", preset, hard, own=own)


@pytest.mark.parametrize("policy,preset,hard,own,side,learned,expected", [
    # paper: hard-label accuracies searched, the random subset searched, the distilled set at its own lr
    ("paper", None, True, False, "syn", None, (True, None)),
    ("paper", "dsa", True, True, "syn", None, (True, None)),
    ("paper", "sre2l", False, True, "syn", None, (False, 0.001)),
    ("paper", "sre2l", False, True, "rdm", None, (True, None)),
    ("paper", "datm", False, True, "syn", 0.02, (False, 0.02)),  # the learned lr
    ("paper", "datm", True, False, "syn", 0.02, (True, None)),  # DATM's hard side: searched
    ("paper", "mtt", True, True, "syn", 0.03, (False, 0.03)),  # MTT's own (hard) evaluation: its learned lr
    ("paper", "mtt", True, True, "rdm", 0.03, (True, None)),
    ("paper", "sre2l", False, True, "syn", 0.02, (False, 0.001)),  # sre2l does not say learned_lr
    # symmetric: everything searched
    ("symmetric", "sre2l", False, True, "syn", None, (True, None)),
    ("symmetric", "datm", False, True, "syn", 0.02, (True, None)),
    # fixed: nothing searched
    ("fixed", None, True, False, "rdm", None, (False, 0.03)),
    ("fixed", "dsa", True, True, "rdm", None, (False, 0.01)),
    ("fixed", "datm", False, True, "syn", 0.02, (False, 0.02)),
])
def test_lr_policy(policy, preset, hard, own, side, learned, expected):
    from ddlib.protocols.preset_eval import LrPlan, lr_plan

    plan = lr_plan(policy, _setting(preset, hard, own), side, learned, [0.001, 0.01])
    assert isinstance(plan, LrPlan) and plan.search is expected[0]
    if not plan.search:
        assert plan.lr == pytest.approx(expected[1])


# --------------------------------------------------------------------------- item 8, parameters


def test_the_presets_student_is_used_unless_the_grid_names_one():
    assert label_robust.validate({"preset": "sre2l"})["model"] == "resnet18_bn"
    assert label_robust.validate({"preset": "sre2l", "model": "convnet"})["model"] == "convnet"
    assert label_robust.validate({})["model"] == "convnet"
    assert augmentation_robust.validate({})["model"] == "convnet"  # its default preset, dsa: ConvNet-3


def test_defaults_are_the_papers():
    p = label_robust.validate({})
    assert (p["lr_policy"], p["lr_select"], p["baseline_seed"], p["val_fraction"]) == ("paper", "validation", None, 0.1)
    assert p["lr_search"] == "full"


# --------------------------------------------------------------------------- issue 12: less work, same numbers


def test_the_random_sides_search_runs_once_per_store_and_every_method_reuses_it(mlflow_store):
    """The random subset's lr search depends on (dataset, IPC, preset, seed, pool), not on the method:
    a second method's cell reuses the first one's (counted), with the same lr and accuracies, and the
    candidates of a seed train together (one call)."""
    from ddlib.protocols.cell import cell_tags

    first, a = _run(label_robust, **TINY, seeds=[0, 1])
    other = {**TINY, "method": "random8", "source": {"kind": "random", "seed": 8}}
    second, b = _run(label_robust, **other, seeds=[0, 1])
    runs = [tracking.client().get_run(c.run_id).data for c in (first, second)]
    # first cell: both sides searched for both seeds; second: the random side's two searches reused
    assert runs[0].metrics["lr_searches_run"] == 4 and runs[0].metrics["lr_searches_reused"] == 0
    assert runs[1].metrics["lr_searches_run"] == 2 and runs[1].metrics["lr_searches_reused"] == 2
    assert runs[1].tags["ddlib.lr_search"] == "full: 2 run, 2 reused from other cells"
    assert b.sides.loc["rdm_hard", "lr search"] == "full: 0 run, 2 reused"
    assert b.sides.loc["syn_hard", "lr search"] == "full: 2 run, 0 reused"
    assert list(a.per_seed["acc_rdm_hard"]) == list(b.per_seed["acc_rdm_hard"])
    assert runs[0].tags["ddlib.lr.rdm_hard"] == runs[1].tags["ddlib.lr.rdm_hard"]
    trials = [e for e in _evals("label_robust") if e["role"].startswith("rdm_hard-lr")]
    assert len(trials) == 4  # 2 lrs x 2 seeds, trained once in the store
    # the new param at its default leaves every key of the cells stored before it
    p = label_robust.validate(dict(TINY))
    old = {k: v for k, v in p.items() if k != "lr_search"}
    assert cell_tags("label_robust", p) == cell_tags("label_robust", old)
    assert cell_tags("label_robust", {**p, "lr_search": "halving"}) != cell_tags("label_robust", old)


def test_halving_trains_all_candidates_a_quarter_then_the_better_half_in_full(mlflow_store):
    from ddlib.protocols.preset_eval import halving_rungs, pick_lr

    assert halving_rungs([0.001, 0.005, 0.01, 0.05, 0.1], 300) == (75, 3)
    assert halving_rungs([0.1], 3) == (1, 1)
    assert pick_lr({0.01: 0.5, 0.1: 0.5, 0.001: 0.4}) == 0.01  # ties: the smaller lr
    params = {**TINY, "recipe": {"epochs": 8}, "lr_grid": [0.001, 0.01, 0.05, 0.1]}
    cell, result = _run(label_robust, **params, seeds=[0], lr_search="halving")
    evals = _evals("label_robust")
    short = {e["role"] for e in evals if e["role"].endswith("-val-e2")}
    full = {e["role"] for e in evals if e["role"].startswith("rdm_hard-lr") and e["role"].endswith("-val")}
    assert short == {f"{side}_hard-lr{lr:g}-val-e2" for side in ("syn", "rdm") for lr in params["lr_grid"]}
    assert len(full) == 2  # the better half of four
    short_acc = {e["role"]: e["accuracy"] for e in evals if e["role"].startswith("rdm_hard-lr") and e["role"].endswith("-e2")}
    best_two = sorted(short_acc, key=lambda r: (short_acc[r], -float(r.split("-lr")[1].split("-")[0])))[-2:]
    assert full == {r.removesuffix("-e2") for r in best_two}
    run = tracking.client().get_run(cell.run_id).data
    assert (run.tags["ddlib.lr_search"].startswith("halving:")
            and result.sides.loc["rdm_hard", "lr search"] == "halving: 1 run, 0 reused")
    # its own leaderboard row (group), and a full search in the same store reuses the full-length runs
    full_cell, _ = _run(label_robust, **params, seeds=[0])
    tags = [tracking.client().get_run(c.run_id).data.tags for c in (cell, full_cell)]
    assert tags[0][TAG["group"]] != tags[1][TAG["group"]]
    assert len([e for e in _evals("label_robust") if e["role"].startswith("rdm_hard-lr") and e["role"].endswith("-val")]) == 4


@pytest.mark.parametrize("bad,message", [
    ({"preset": "nosuchmethod"}, "preset:"),
    ({"lr_select": "none"}, "lr_policy: fixed"),
    ({"lr_policy": "best"}, "lr_policy must be one of"),
    ({"lr_grid": []}, "lr_grid"),
    ({"val_fraction": 1.5}, "val_fraction"),
    ({"val_fraction": None}, "nothing to score the lr search on"),
    ({"baseline_seed": "0"}, "baseline_seed"),
    ({"teacher_recipe": {"epoch": 1}}, "teacher_recipe"),
    ({"lr_search": "bayes"}, "lr_search must be one of"),
])
def test_preset_parameters_are_validated(bad, message):
    with pytest.raises(ValueError, match=message):
        label_robust.validate({**TINY, **bad})


def test_ars_needs_a_preset_with_augmentation():
    with pytest.raises(ValueError, match="needs a preset"):
        augmentation_robust.validate({"preset": None})
    with pytest.raises(ValueError, match="no augmentation"):
        augmentation_robust.validate({"preset": "dc"})


# --------------------------------------------------------------------------- ARS


def test_ars_with_and_without_augmentation_under_the_policy(mlflow_store):
    params = {k: v for k, v in TINY.items() if k not in ("recipe", "real_recipe")}
    cell, result = _run(augmentation_robust, **params, seeds=[0], preset="dsa", lr_policy="symmetric")
    evals = _evals("augmentation_robust")
    final = {e["role"]: e for e in evals if "-lr" not in e["role"]}
    assert final["syn_noaug"]["augment"] == final["rdm_noaug"]["augment"] == "none"
    assert final["syn_aug"]["augment"].startswith("dsa(") and final["rdm_aug"]["augment"].startswith("dsa(")
    assert {e["role"].split("-lr")[0] for e in evals if "-lr" in e["role"]} == {"syn_aug", "rdm_aug", "syn_noaug",
                                                                               "rdm_noaug"}
    row = result.per_seed.iloc[0]
    assert row["ior_aug"] == pytest.approx(row["acc_syn_aug"] - row["acc_rdm_aug"])  # points of %
    assert row["ior_noaug"] == pytest.approx(row["acc_syn_noaug"] - row["acc_rdm_noaug"])
    board = report.ars_leaderboard()
    assert list(board["method"]) == ["random7"] and list(board["revision"]) == [str(augmentation_robust.REVISION)]
    sweep = report.weight_sweep("ars")
    assert [c for c in sweep.columns if c.startswith("ars @")] == [f"ars @ {g:g}" for g in report.SWEEP]


# --------------------------------------------------------------------------- leaderboard rows


def _fake_cell(tracker, params, revision_tags, pool, acc):
    from ddlib.protocols.cell import cell_tags

    tags = {**cell_tags("label_robust", params), "ddlib.pool": pool}
    run_id = tracker.start_run("cell", params=params, tags=tags)
    tracker.log_per_seed(run_id, [{"seed": 0, "acc_syn_hard": acc, "acc_real_hard": 0.9, "acc_syn_any": acc,
                                   "acc_rdm_any": 0.3}])
    tracker.end_run(run_id)
    assert tags[TAG["revision"]] == revision_tags


def test_a_leaderboard_row_never_mixes_revisions_or_real_data_pools(mlflow_store, monkeypatch):
    tracking.init_store()
    tracker = tracking.Tracker("label_robust")
    params = label_robust.validate({"method": "random", "ipc": 1, "seeds": [0]})
    current = str(label_robust.REVISION)
    _fake_cell(tracker, params, current, "pool A", 0.5)
    _fake_cell(tracker, params, current, "pool A", 0.5)  # a rerun: the same row
    _fake_cell(tracker, params, current, "pool B", 0.6)  # other real data: another row
    with monkeypatch.context() as patch:  # an older definition of the protocol (its spec's revision): another row
        import ddlib.protocols

        patch.setattr(ddlib.protocols, "protocol_revision", lambda name: label_robust.SPEC.revision - 1)
        _fake_cell(tracker, params, str(label_robust.SPEC.revision - 1), "pool A", 0.7)
    board = report.lrs_leaderboard()
    assert sorted(zip(board["revision"], board["acc_syn_hard_mean"])) == sorted(
        [(current, 0.5), (current, 0.6), (str(int(current) - 1), 0.7)])
    assert (board["seeds"] == 1).all()


# --------------------------------------------------------------------------- determinism


DETERMINISM_SCRIPT = """
import json, sys
from ddlib.protocols import label_robust
params = json.loads(sys.argv[1])
cell = label_robust.open_cell(**params)
cell.progress = False
result = label_robust.evaluate(cell, label_robust.obtain(cell))
cell.close()
evals = cell.tracker.client.search_runs([cell.tracker.experiment_id], "tags.`ddlib.kind` = 'eval'")
print(json.dumps({"per_seed": result.per_seed.to_dict("list"), "lr": result.sides["lr"].to_dict(),
                  "trained": len(evals)}))
"""


@pytest.mark.slow  # two fresh interpreters (imports, store creation): about 18 s on a 2-core CPU
def test_same_config_and_seed_give_the_same_scores_in_two_processes_with_fresh_stores(tmp_path):
    """A DSA-preset cell run in two fresh processes, each into its own new store, trains everything twice
    and gives the same per-seed scores and chosen lrs. Why it takes about 18 s: each process imports
    torch, ddlib and MLflow (a few seconds), creates its new SQLite store (MLflow's schema migrations,
    the largest part of each process) and only then trains the cell's 7 tiny models (a few seconds); a new
    process and an empty store are the point: in one process or one store the second run could reuse
    the first's models or random state."""
    params = {**TINY, "seeds": [0], "preset": "dsa"}  # a searched lr, DSA draws, a random subset, a teacher-free cell
    outputs = []
    for attempt in ("first", "second"):  # a new, empty store each time: nothing can be reused
        store = tmp_path / attempt
        env = {**os.environ, "DDLIB_MLRUNS": str(store), "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}",
               "DDLIB_NUM_THREADS": "1",
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        done = subprocess.run([sys.executable, "-c", DETERMINISM_SCRIPT, json.dumps(params)], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        outputs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = outputs
    assert first["trained"] == second["trained"] > 0  # the second process trained everything again
    assert first["per_seed"] == second["per_seed"] and first["lr"] == second["lr"]


@pytest.mark.parametrize("lr_select", ["validation", "test"])
def test_the_searchs_model_of_the_chosen_lr_is_tested_not_trained_again(tmp_path, monkeypatch, lr_select):
    """An lr search trains every candidate; the side's evaluation at the chosen lr tests the search's
    model of that lr instead of training the same model again: the scores are bit for bit those of
    training it again (DD-Ranking's flow), with one training fewer per searched side and seed (the DSA
    preset, every side searched: lr_policy symmetric). Scored on the test set, as the peer does, the
    search's evaluation of the chosen lr is the side's (one key): nothing trains again either way.
    Why it takes 30 s (validation) and 24 s (test) alone on one Zen 3 thread: the same cell twice in
    fresh stores, each 2 seeds x 2 sides x 2 lrs of 30-epoch DSA trainings (at 15 epochs the models
    stay near chance, 16-36 %, and the check that they learned fails) and the full-data reference."""
    from ddlib.protocols import preset_eval

    def run(store: str, adopt: bool):
        monkeypatch.setenv("DDLIB_MLRUNS", str(tmp_path / store))
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / store / 'mlflow.db'}")
        monkeypatch.setattr(tracking, "_CLIENTS", {})
        if not adopt:
            search = preset_eval.SideTrainer.search
            monkeypatch.setattr(preset_eval.SideTrainer, "search", lambda *a, **k: (*search(*a, **k)[:2], None))
        params = {**TINY, "ipc": 5, "recipe": {"epochs": 30}, "preset_epochs": 30, "real_recipe": {"epochs": 3},
                  "lr_grid": [0.01, 0.05]}
        cell, result = _run(label_robust, **params, seeds=[0, 1], preset="dsa", lr_policy="symmetric", lr_select=lr_select)
        return result, tracking.client().get_run(cell.run_id).data.metrics

    adopted, m_adopted = run("adopted", True)
    trained, m_trained = run("trained", False)
    assert adopted.per_seed.equals(trained.per_seed)
    assert (adopted.per_seed[["acc_syn_hard", "acc_rdm_hard"]] > 30).all().all()  # models that learned (chance 10 %)
    searched = 2 * 2 if lr_select == "validation" else 0  # syn_hard and rdm_hard, two seeds each
    assert m_trained["models_trained"] - m_adopted["models_trained"] == searched
