"""BEARD's protocol end to end on the embedded digits data: model pool, attacks, skips, scores, caching."""

import pytest

from ddlib import metrics, tracking

from ddlib import report
from ddlib.protocols import adversarial

TINY = {"dataset": "digits", "seeds": [0], "device": "cpu", "method": "random", "ipc": 5,
        "recipe": {"epochs": 15, "batch_size": 64}, "attacks": ["fgsm", "pgd", {"cw": {"steps": 5}}, "deepfool"],
        "attack_size": 60, "attack_batch_size": 32}


@pytest.mark.parametrize("bad,message", [
    ({"mode": "sideways"}, "mode must be one of"),
    ({"target": "far"}, "target must be one of"),
    ({"attacks": ["fgsm", "nope"]}, "attacks: unknown attack 'nope'"),
    ({"attacks": [{"pgd": {"epsilon": 1}}]}, "attacks: attack 'pgd': unknown parameter"),
    ({"attacks": []}, "at least one attack"),
    ({"mode": "targeted", "attacks": ["deepfool", "autoattack"]}, "none of .* can target"),
    ({"training": "freeat"}, "training: "),
    ({"attack_size": 0}, "attack_size must be null or a positive integer"),
    ({"eps_curve": {"attack": "cw", "eps": [0.1]}}, "has no epsilon"),
    ({"eps_curve": {"attack": "pgd"}}, "eps_curve must be null or"),
    ({"alpha": 2}, "alpha must be a number in"),
    ({"attacks": ["pgd", {"pgd": {"eps": "4/255"}}]}, "each attack may appear once"),
    ({"mode": "targeted", "eps_curve": {"attack": "autoattack", "eps": ["4/255"]}}, "eps_curve: mode targeted"),
])
def test_bad_parameters_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        adversarial.validate({"dataset": "digits", **bad})


def test_beard_defaults():
    p = adversarial.validate({})
    assert p["recipe"] == {"epochs": 1000} and p["augment"] == "dsa" and p["training"] == "standard"
    assert p["attacks"] == ["fgsm", "pgd", "pgd_l2", "cw", "deepfool", "autoattack"]
    assert p["attack_size"] is None  # the whole test set unless asked


def _run(**params):
    cell = adversarial.open_cell(**{**TINY, **params})
    distilled = adversarial.obtain(cell)
    models = adversarial.train_models(cell, distilled)
    result = adversarial.evaluate(cell, distilled, models)
    cell.close()
    return cell, models, result


def test_targeted_then_untargeted_reuses_the_pool_and_skips_what_cannot_target(mlflow_store):
    cell_t, models_t, targeted = _run(mode="targeted", eps_curve={"attack": "fgsm", "eps": ["2/255", "8/255"]})
    assert not models_t[0].reused
    row = targeted.per_seed.iloc[0]
    # DeepFool cannot target: recorded as skipped, never with an accuracy (BEARD logs the clean one)
    assert "deepfool.robust_acc" not in targeted.per_seed
    status = targeted.attacks.set_index("attack")["status"].to_dict()
    assert status == {"fgsm": "ran", "pgd": "ran", "cw": "ran", "deepfool": "skipped"}
    tags = tracking.client().get_run(cell_t.run_id).data.tags
    assert "no targeted mode" in tags["ddlib.skipped.deepfool"]
    for attack in ("fgsm", "pgd", "cw"):
        assert 0 <= row[f"{attack}.asr_beard"] <= row[f"{attack}.asr"] <= row.clean_acc + 1e-9
        assert row[f"{attack}.attack_seconds"] >= 0 and row[f"{attack}.targeted_success"] >= 0
        assert row[f"{attack}.max_linf"] <= (8 / 255 + 1e-6 if attack != "cw" else 1)
    accs = [100 * row[f"{a}.robust_acc"] for a in ("fgsm", "pgd", "cw")]
    times = [row[f"{a}.attack_seconds"] for a in ("fgsm", "pgd", "cw")]
    assert row.rr == pytest.approx(metrics.rr(100 * row.clean_acc, accs))
    assert row.ae == pytest.approx(metrics.ae(row.clean_seconds, times))
    assert row.crei == pytest.approx(0.5 * row.rr + 0.5 * row.ae)
    assert row.rcr == pytest.approx(metrics.rcr(100 * row.clean_acc, accs))
    assert row["curve.fgsm.0.031373"] == row["fgsm.robust_acc"]  # the 8/255 point is the FGSM attack itself

    cell_u, models_u, untargeted = _run(mode="untargeted")
    assert models_u[0].reused and models_u[0].run_id == models_t[0].run_id  # the model pool, not retrained
    assert set(untargeted.attacks.status) == {"ran"} and "deepfool.robust_acc" in untargeted.per_seed
    results = tracking.runs("adversarial", kind="result")
    assert (results["tags.ddlib.role"] == "clean-seed0").sum() == 1  # the clean pass is shared by both modes

    n_results = len(results)
    _, _, again = _run(mode="untargeted")  # a rerun recomputes nothing
    assert len(tracking.runs("adversarial", kind="result")) == n_results
    assert again.per_seed.equals(untargeted.per_seed)

    board = report.robustness_leaderboard()
    assert sorted(board["mode"]) == ["targeted", "untargeted"]
    assert set(board.seeds) == {1}  # the rerun's seeds replace the first run's, never double
    by_mode = board.set_index("mode")
    assert by_mode.loc["untargeted", "rr_mean"] == pytest.approx(untargeted.per_seed.rr.iloc[0])
    assert by_mode.loc["targeted", "crei_mean"] == pytest.approx(row.crei)
    unified = report.unified_leaderboard().set_index("mode")
    assert unified.loc["targeted", "rrm_mean"] == pytest.approx(row.rr)  # one IPC: RRM is RR
    curves = report.eps_curves()
    assert list(curves.eps.round(6)) == [0.007843, 0.031373]


def test_unified_scores_pool_the_ipcs(mlflow_store):
    results = []
    for ipc in (1, 3):
        _, _, result = _run(ipc=ipc, attacks=["fgsm", "pgd"])
        results.append(result.per_seed.iloc[0])
    clean = [100 * r.clean_acc for r in results]
    accs = [[100 * r["fgsm.robust_acc"], 100 * r["pgd.robust_acc"]] for r in results]
    times = [[r["fgsm.attack_seconds"], r["pgd.attack_seconds"]] for r in results]
    unified = report.unified_leaderboard()
    assert len(unified) == 1 and unified.loc[0, "ipcs"] == "1,3"
    assert unified.loc[0, "rrm_mean"] == pytest.approx(metrics.rr_multi(clean, accs))
    assert unified.loc[0, "aem_mean"] == pytest.approx(metrics.ae_multi([r.clean_seconds for r in results], times))
    assert unified.loc[0, "rcrm_mean"] == pytest.approx(metrics.rcr_multi(clean, accs))
    _run(ipc=1, attacks=["fgsm", "pgd"], attack_size=40)  # the same IPC in another configuration: never pooled
    unified = report.unified_leaderboard().sort_values("ipcs").reset_index(drop=True)
    assert list(unified.ipcs) == ["1", "1,3"]
    assert unified.loc[1, "rrm_mean"] == pytest.approx(metrics.rr_multi(clean, accs))


def test_adversarial_training_is_a_different_pool_entry(mlflow_store):
    _, standard, _ = _run(attacks=["fgsm"])
    _, robust, result = _run(attacks=["fgsm"], training={"pgd_at": {"steps": 2}})
    assert not robust[0].reused and robust[0].run_id != standard[0].run_id
    run = tracking.client().get_run(robust[0].run_id)
    assert run.data.params["objective"].startswith("pgd_at(")
    board = report.robustness_leaderboard()
    assert sorted(board.training) == ["standard", '{"pgd_at": {"steps": 2}}']  # nested params read back whole


def test_the_leaderboard_row_ignores_spelling_and_what_the_summary_recomputes():
    from ddlib.protocols.cell import cell_tags
    from ddlib.tracking import TAG

    def group(**params):
        return cell_tags("adversarial", adversarial.validate({"dataset": "digits", **params}))[TAG["group"]]

    assert group(attacks=["fgsm"]) == group(attacks=[{"fgsm": {"eps": "8/255"}}])
    assert group(alpha=0.3) == group() and group(eps_curve={"attack": "pgd", "eps": [0.01]}) == group()
    assert group(target="random") == group()  # untargeted: the target kind changes nothing
    assert group(mode="targeted", target="random") != group(mode="targeted")
    assert group(attacks=[{"fgsm": {"eps": "4/255"}}]) != group(attacks=["fgsm"])
    assert group(attack_size=100) != group()


def test_attack_size_is_exact_and_needs_one_image_per_class(mlflow_store):
    cell = adversarial.open_cell(**{**TINY, "attack_size": 25})
    images, labels = adversarial.attack_subset(cell)
    assert len(labels) == 25 and set(labels.tolist()) == set(range(10))
    cell.close()
    cell = adversarial.open_cell(**{**TINY, "attack_size": 5})
    with pytest.raises(ValueError, match="attack_size: a stratified subset needs between 10"):
        adversarial.attack_subset(cell)


def test_timings_from_another_device_are_another_row(mlflow_store):
    from ddlib.tracking import TAG

    first, _, _ = _run(attacks=["fgsm"])
    second, _, _ = _run(attacks=["fgsm"], seeds=[1])
    tracking.client().set_tag(second.run_id, TAG["device_name"], "cuda: a GPU")  # as if run on another machine
    board = report.robustness_leaderboard().set_index("device")
    assert len(board) == 2 and set(board.seeds) == {1}  # one seed each: never pooled across devices
    assert sorted(report.unified_leaderboard().device) == sorted(board.index)


def test_random_targets_and_the_full_reference(mlflow_store):
    _, _, result = _run(attacks=["fgsm"], mode="targeted", target="random")
    assert set(result.attacks.status) == {"ran"}
    cell, models, full = _run(attacks=["fgsm"], method="full", real_recipe={"epochs": 2})
    assert cell.params["ipc"] == 0 and tracking.client().get_run(models[0].run_id).data.params["recipe.epochs"] == "2"
    assert tracking.client().get_run(models[0].run_id).data.params["train_size"] == "1347"  # every training image
    board = report.format_leaderboard(report.robustness_leaderboard())
    assert set(board.ipc) == {5, "all"}


@pytest.mark.slow
def test_pgd_adversarial_training_raises_pgd_robust_accuracy(mlflow_store):
    """On digits at eps 32/255 (8/255 barely dents 8x8 digits), a ConvNet trained with PGD-AT keeps
    more of its accuracy under PGD than one trained plainly. Measured here, seeds 0/1/2: +17.8,
    +11.3, +10.4 points; the test asks for 5."""
    eps = "32/255"
    common = dict(TINY, ipc=10, recipe={"epochs": 150}, augment=None, attack_size=None,
                  attacks=[{"pgd": {"eps": eps, "alpha": "8/255"}}])
    robust = {}
    for name, training in (("standard", "standard"), ("pgd_at", {"pgd_at": {"eps": eps, "alpha": "8/255", "steps": 5}})):
        _, _, result = _run(**{**common, "training": training})
        robust[name] = result.per_seed.iloc[0]["pgd.robust_acc"]
    assert robust["pgd_at"] > robust["standard"] + 0.05, robust
