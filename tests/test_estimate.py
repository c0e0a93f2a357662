"""An honest estimate before the first score (issue 53): the model of a cell's work (ddlib.run.work) counts
every model a cell trains, its arithmetic turns the machine's calibrated rates (ddlib.run.calibrate) into
seconds, the dry run gives a first run an estimate and checks the store and the device (ddlib.run.plan),
the running cell's line says what it has left at its own pace (ddlib.store.progress), and ``--quick``.
No timings: the calibration is replaced by fixed rates."""

from __future__ import annotations

import time
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

from ddlib.run import calibrate
from ddlib.run.calibrate import REFERENCE_PACE, Probe, Rates, training_seconds
from ddlib.run.timing import seconds
from ddlib.run.work import Data, Passes, Training, cell_work

DIGITS = Data(shape=(1, 8, 8), classes=10, train=1211, whole=1347, val=136, test=450)  # 10 % held out per class
RATES = Rates(step=0.01, image=0.001, test_image=0.0005, call=0.1, reference=REFERENCE_PACE)
PROBE = Probe("convnet", (1, 8, 8), 10)
CPU = torch.device("cpu")


@pytest.fixture
def calibrated(monkeypatch, tmp_path):
    """Every probe "measures" :data:`RATES` (recorded), the reference workload takes what it took then."""
    monkeypatch.setenv("DDLIB_CACHE", str(tmp_path / "cache"))
    measured = []
    monkeypatch.setattr(calibrate, "measure", lambda probe, device, threads: measured.append(probe) or replace(RATES))
    monkeypatch.setattr(calibrate, "pace", lambda device, threads, fresh=False: RATES.reference)
    return measured


def _work(protocol: str, **params) -> list:
    """The work of a digits cell (a protocol without a validation split trains on all 1,347 images)."""
    from ddlib.protocols import protocol_module

    p = protocol_module(protocol).validate({"dataset": "digits", **params})
    return cell_work(protocol, p, DIGITS if p.get("val_fraction") else replace(DIGITS, train=1347, val=0), CPU)


def _models(work: list, trained: bool = True) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in work:
        if isinstance(item, Training) and item.trained == trained:
            out[item.stem] = out.get(item.stem, 0) + item.models
    return out


# --------------------------------------------------------------------------- the arithmetic


def test_a_models_seconds_are_its_steps_images_test_pass_and_call():
    t = Training("syn_hard", 2, images=10, epochs=3, batch_size=4, probe=PROBE, scored_on=100)
    one = 3 * (3 * 0.01 + 10 * 0.001) + 100 * 0.0005 + 0.1  # 3 steps (4 + 4 + 2 images) per epoch
    assert training_seconds(t, RATES) == pytest.approx(one)
    assert seconds([t], lambda p: RATES, record=0.35) == pytest.approx(2 * (one + 0.35))
    # one of the two found in the store: its record read, not its training
    assert seconds([t], lambda p: RATES, record=0.35, trained={0: 1}) == pytest.approx(one + 0.35 + 0.35)
    tested = replace(t, trained=False)  # an lr search's model: tested only
    assert seconds([tested], lambda p: RATES, record=0.35) == pytest.approx(2 * (100 * 0.0005 + 0.1 + 0.35))
    adversarial = replace(t, models=1, gradient_passes=11)  # 10 PGD steps crafting each batch, then the step
    assert training_seconds(adversarial, RATES) == pytest.approx(3 * 11 * (3 * 0.01 + 10 * 0.001) + 100 * 0.0005 + 0.1)
    scaled = replace(t, models=1, scale=0.5)  # an architecture of half the probe's FLOPs
    assert training_seconds(scaled, RATES) == pytest.approx(3 * (3 * 0.01 + 5 * 0.001) + 50 * 0.0005 + 0.1)
    attack = Passes("attack pgd", PROBE, images=200, gradients=11, forwards=1, steps=10, recorded=1)
    assert seconds([attack], lambda p: RATES, record=0.35) == pytest.approx(200 * (11 * 0.001 + 0.0005) + 10 * 0.01 + 0.35)


def test_teachers_relabelling_online_add_a_forward_per_image_and_epoch():
    teacher = Rates(step=0.0, image=0.0, test_image=0.002, call=0.0, reference=REFERENCE_PACE)
    t = Training("syn_any", 1, images=10, epochs=3, batch_size=10, probe=PROBE, scored_on=0, teachers=(PROBE,))
    assert training_seconds(t, RATES, [teacher]) == pytest.approx(3 * (0.01 + 10 * 0.001 + 10 * 0.002) + 0.1)


# --------------------------------------------------------------------------- every model a cell trains


def test_label_robust_counts_every_search_candidate_and_the_full_data_reference():
    """The default cell (5 seeds, DD-Ranking's 5-lr search of both hard-label sides): 25 candidates
    per side scored on the validation split, each side's chosen model tested only, and the full-data
    reference (300 epochs on the whole training set) per seed."""
    work = _work("label_robust", ipc=1)
    assert _models(work) == {"syn_hard-lr*-val": 25, "rdm_hard-lr*-val": 25, "real_hard": 5}
    assert _models(work, trained=False) == {"syn_hard": 5, "rdm_hard": 5}
    by_stem = {t.stem: t for t in work}
    assert (by_stem["real_hard"].images, by_stem["real_hard"].epochs, by_stem["real_hard"].scored_on) == (1347, 300, 450)
    assert (by_stem["syn_hard-lr*-val"].images, by_stem["syn_hard-lr*-val"].scored_on) == (10, 136)
    assert _models(_work("label_robust", ipc=1, lr_policy="fixed")) == {"syn_hard": 5, "rdm_hard": 5, "real_hard": 5}
    halving = _work("label_robust", ipc=1, seeds=[0], lr_search="halving")  # 5 at 75 epochs, the best 3 at 300
    assert _models(halving) == {"syn_hard-lr*-val-e75": 5, "syn_hard-lr*-val": 3, "rdm_hard-lr*-val-e75": 5,
                                "rdm_hard-lr*-val": 3, "real_hard": 1}


def test_selection_networks_of_forgetting_el2n_and_kcenter_are_counted():
    """Forgetting's and EL2N's networks (20 epochs on the cell's training split; EL2N ten of them) and
    K-Center's feature network, trained to make the set, before anything of the protocol."""
    forgetting = _work("label_robust", method="forgetting", ipc=1, lr_policy="fixed", seeds=[0])
    first = forgetting[0]
    assert (first.stem, first.models, first.images, first.epochs, first.kept) == ("selection: forgetting", 1, 1211, 20,
                                                                                   "cache")
    el2n = _work("compression", method="el2n", ipc=1, seeds=[0])
    assert _models(el2n) == {"selection: el2n": 10, "syn-set": 1, "real-full": 1}
    assert any(isinstance(p, Passes) and p.what == "selection: el2n scores" for p in el2n)
    assert _models(_work("augmentation", method="kcenter", ipc=1, seeds=[0], augmentations=["none"])) == {
        "selection: feature network": 1, "syn-none": 1}
    herding_dc = _work("augmentation", method="herding_dc", ipc=1, seeds=[0], augmentations=["none"])[0]
    assert (herding_dc.stem, herding_dc.epochs) == ("selection: feature network", 50)  # trained to convergence


def test_teachers_of_a_soft_label_preset_are_counted():
    work = _work("label_robust", ipc=1, seeds=[0], preset="sre2l", lr_policy="fixed")
    teachers = [t for t in work if t.stem.startswith("teacher")]
    assert [(t.probe.model, t.images, t.kept) for t in teachers] == [("resnet18_bn", 1211, "teachers")]
    online = [t for t in work if t.stem in ("syn_any", "rdm_any")]
    assert online and all(t.teachers == (teachers[0].probe,) for t in online)  # each batch relabelled


def test_privacy_counts_its_shadow_models_and_blackbox_its_targets():
    assert _models(_work("privacy", ipc=2, seeds=[0, 1])) == {"syn": 2, "rdm": 2, "shadow_ipc": 2, "real": 2,
                                                             "shadow_full": 2}
    shadow_full = next(t for t in _work("privacy", ipc=2, seeds=[0]) if t.stem == "shadow_full")
    assert shadow_full.images == 1347 - 225  # the training split less the members (min(500, 1347 // 2, 450 // 2))
    blackbox = _work("blackbox", method="kcenter", ipc=1, seeds=[0], target_models=["random", "full"],
                     attacks=["fgsm"])
    assert _models(blackbox) == {"selection: feature network": 1, "model": 3}  # the surrogate and two targets
    assert sorted(t.images for t in blackbox if isinstance(t, Training) and t.stem == "model") == [10, 10, 1347]
    assert sum(isinstance(p, Passes) and p.what.startswith("attack fgsm") for p in blackbox) == 3  # crafted, 2 targets


def test_adversarial_counts_its_attacks_and_training_objective():
    work = _work("adversarial", ipc=1, seeds=[0], training="pgd_at", attacks=["fgsm", "pgd"], attack_size=100)
    (model,) = [t for t in work if isinstance(t, Training)]
    assert (model.epochs, model.gradient_passes) == (1001, 11)  # BEARD's dc_step 1000 epochs; 10 PGD steps each
    attacks = {p.what: p for p in work if isinstance(p, Passes) and p.what.startswith("attack")}
    assert set(attacks) == {"attack fgsm", "attack pgd"} and all(p.images == 100 for p in attacks.values())


def test_nas_counts_each_architecture_and_scales_its_costs_by_itsforward_flops(tmp_path):
    """One probe (the all-3x3 cell) for every sampled architecture, each scaled by its FLOPs, which the
    five one-operation cells give exactly (a network's FLOPs are a base plus a term per edge)."""
    import json

    from ddlib.run.calibrate import forward_flops

    archs = ["|nor_conv_3x3~0|+|none~0|skip_connect~1|+|nor_conv_1x1~0|avg_pool_3x3~1|nor_conv_3x3~2|",
             "|skip_connect~0|+|skip_connect~0|skip_connect~1|+|skip_connect~0|skip_connect~1|skip_connect~2|",
             "|nor_conv_1x1~0|+|nor_conv_3x3~0|nor_conv_1x1~1|+|none~0|none~1|nor_conv_3x3~2|"]
    csv = tmp_path / "gt.csv"
    csv.write_text("ArchitectureString,acc\n" + "".join(f"{a},{50 + i}\n" for i, a in enumerate(archs)))
    work = _work("nas", method="random", ipc=1, seeds=[0, 1], num_archs=3, ground_truth=str(csv), gt_column="acc")
    assert [(t.models, t.scored_on, t.probe) for t in work] == [(2, 136, work[0].probe)] * 3  # validation split
    probe = work[0].probe
    exact = [forward_flops(replace(probe, model_kwargs=json.dumps({**json.loads(probe.model_kwargs), "arch": a})))
             for a in archs]
    assert sorted(t.scale for t in work) == pytest.approx(sorted(f / forward_flops(probe) for f in exact))


# --------------------------------------------------------------------------- the calibration


def test_rates_are_measured_once_per_machine_and_scaled_by_its_pace_now(calibrated, monkeypatch):
    from ddlib.run.estimate import Machine

    assert calibrate.rates(PROBE, CPU, 1) == calibrate.rates(PROBE, CPU, 1) and len(calibrated) == 1  # then cached
    monkeypatch.setattr(calibrate, "pace", lambda device, threads, fresh=False: 2 * RATES.reference)  # twice as busy
    machine = Machine(CPU, 1)
    assert machine.rates(PROBE).image == pytest.approx(2 * RATES.image) and len(calibrated) == 1
    assert "2.0x slower than when calibrated" in machine.describe()


# --------------------------------------------------------------------------- the dry run


def _grid(tmp_path, protocol="label_robust", **params) -> str:
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"protocol": protocol, "params": {"dataset": "digits", **params},
                                    "grid": {"method": ["random"], "ipc": [1]}}))
    return str(path)


def test_a_first_dry_run_estimates_from_the_work_and_counts_every_model(calibrated, mlflow_store, tmp_path, capsys):
    """The issue's first dry run said "no time estimate for every cell (no earlier runs of their recipe)"."""
    from ddlib.run.estimate import FIRST_RUN
    from ddlib.run.plan import plan_grid, print_plan

    path = _grid(tmp_path, seeds=[0])
    assert print_plan(path) == 0
    out = capsys.readouterr().out
    assert FIRST_RUN in out and "no time estimate" not in out
    assert "13 models; trains 11 (rdm_hard-lr*-val 5, real_hard 1, syn_hard-lr*-val 5)" in out
    assert "tests 2 an lr search trained (rdm_hard 1, syn_hard 1)" in out
    assert "calibrated this machine for convnet 1x8x8" in out
    from ddlib.run.calibrate import CELL_FIXED_SECONDS, CELL_SECONDS, RECORD_SECONDS
    from ddlib.run.work import data_of

    assert data_of({"dataset": "digits", "val_fraction": 0.1}) == DIGITS  # the split Cell.open makes
    cell = plan_grid(path).cells[0]
    work = _work("label_robust", ipc=1, seeds=[0])
    expected = seconds(work, lambda p: RATES, RECORD_SECONDS) + CELL_FIXED_SECONDS + CELL_SECONDS  # at the reference pace
    assert cell.minutes == pytest.approx(expected / 60)


def test_the_dry_run_refuses_a_missing_device_and_an_unwritable_store(mlflow_store, tmp_path, monkeypatch, capsys):
    """Issue 53, 7.3: both said "would run 1"."""
    from ddlib.run.plan import print_plan

    assert print_plan(_grid(tmp_path, device="cuda:99")) == 2
    err = capsys.readouterr().err
    assert "device 'cuda:99': this machine has" in err and len(err.strip().splitlines()) == 2  # the error, "stopped"
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("DDLIB_MLRUNS", str(blocker / "store"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{blocker / 'store' / 'mlflow.db'}")
    assert print_plan(_grid(tmp_path)) == 2
    assert "cannot be written" in capsys.readouterr().err
    from ddlib.cli import main as cli_main

    path = tmp_path / "set.npz"  # `ddlib score --dry-run` writes its params file into the store first
    np.savez(path, images=np.zeros((10, 1, 8, 8), dtype=np.float32), labels=np.arange(10))
    assert cli_main(["score", str(path), "--dataset", "digits", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "cannot be written: " in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# --------------------------------------------------------------------------- the running cell


def test_the_running_line_says_what_the_cell_has_left_at_its_own_pace(tmp_path, monkeypatch):
    """A cell of 100 predicted seconds, 20 of them found in the store, that took 10 s for its first 5:
    the other 75 take 150 s at that pace, however fast the dry run thought the machine. The clock the
    writer reads stands still at 10 s after its start (a loaded machine's stall cannot move the pace)."""
    from ddlib.store import progress
    from ddlib.store.progress import ProgressWriter, describe, read

    writer = ProgressWriter(tmp_path / "p.json", "cell", every=0)
    writer.plan(100.0)
    writer.skipped(20.0)
    now = time.time()
    writer.started = now - 10
    monkeypatch.setattr(progress.time, "time", lambda: now)
    call = SimpleNamespace(runs=((0, 0.01),), epoch=5, epochs=10, models_before=0, models=1, eta_seconds=10.0)
    writer("syn_hard", call, unit=1.0)  # 5 epochs of one model, 1 s each
    record = read(tmp_path / "p.json")
    assert record["cell_eta"] == pytest.approx(150, rel=0.02)
    assert "cell ~2:3" in describe(record)
    later = SimpleNamespace(runs=((0, 0.1),), epoch=0, epochs=10, models_before=0, models=1, eta_seconds=None)
    writer("rdm_hard", call, unit=1.0)
    writer("rdm_hard", later, unit=1.0)  # a new call: the first one's 5 s stay done
    assert writer.trained == 5.0


# --------------------------------------------------------------------------- --quick


def test_quick_is_one_seed_few_epochs_and_given_parameters_win(tmp_path, mlflow_store, calibrated, capsys):
    from ddlib.cli import main as cli_main
    from ddlib.scoring import QUICK, score_grid

    path = tmp_path / "set.npz"
    np.savez(path, images=np.random.default_rng(0).random((10, 1, 8, 8), dtype=np.float32), labels=np.arange(10))
    quick = score_grid(path, "digits", quick=True)["params"]
    assert quick == {"dataset": "digits", **QUICK["label_robust"]} and quick["seeds"] == [0]
    given = score_grid(path, "digits", quick=True, seeds=[1, 2], recipe={"epochs": 5})["params"]
    assert given["seeds"] == [1, 2] and "epochs" not in given and given["recipe"] == {"epochs": 5}
    assert cli_main(["score", str(path), "--dataset", "digits", "--quick", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "quick look (seeds [0], epochs 30" in out and "a first look, not a result" in out
    assert '"seeds": [0]' in out and "min (no earlier run of this recipe: from its work" in out


@pytest.mark.filterwarnings("ignore:sanity")  # one epoch: near chance, as intended
def test_a_quick_score_in_process_is_tagged_as_a_first_look(tmp_path, mlflow_store):
    import ddlib
    from ddlib.scoring import QUICK_TAG
    from ddlib.store.tracking import client

    images = np.random.default_rng(0).random((10, 1, 8, 8), dtype=np.float32)
    result = ddlib.score(images, np.arange(10), dataset="digits", quick=True, epochs=1, real_recipe={"epochs": 1},
                         lr_grid=[0.01])
    assert list(result.per_seed["seed"]) == [0]  # the quick profile's one seed
    assert "a first look, not a result" in client().get_run(result.run_id).data.tags[QUICK_TAG]
