"""What ``vs_ddranking.py`` reports: the comparison tables, the peer's defects met, where each side's time
goes, the short record (``bench/records/vs_ddranking_<device>.json``) and the time budget of one device call.
Imports nothing of ddlib (the script's own module imports this one)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

RECORDS = Path(__file__).resolve().parent / "records"

ACC_KEYS = {"lrs": ["acc_syn_hard", "acc_real_hard", "acc_syn_any", "acc_rdm_any"],
            "ars": ["acc_syn_aug", "acc_rdm_aug", "acc_syn_noaug", "acc_rdm_noaug"]}
SCORE = {"lrs": "lrs", "ars": "ars"}


def _parts(wall: float, train: float, test: float, data: float, **extra) -> dict:
    other = wall - train - test - data
    return {"wall": round(wall, 2), "train": round(train, 2), "test": round(test, 2), "data": round(data, 2),
            "python_other": round(max(other, 0.0), 2), **extra}


def ours_breakdown(out: dict) -> dict:
    """ddlib's cell: its trials' ``train_seconds`` / ``eval_seconds`` (a batched group's time is shared
    among its models, so the sum is the group's time), opening the cell (data, store) as data; the rest
    (lr searches' bookkeeping, MLflow writes, scoring) is python/other. Trials found in the store
    (reused, not trained by this cell) are not its children; an lr search's summary run has no seconds."""
    trained = [t for t in out["trials"] if _num(t.get("train_seconds")) > 0]
    return _parts(out["wall_seconds"], sum(_num(t["train_seconds"]) for t in trained),
                  sum(_num(t["eval_seconds"]) for t in trained), out["open_seconds"], trainings=len(trained))


def peer_breakdown(raw: dict) -> dict:
    """The peer's protocol: ``train_one_epoch`` and ``validate`` timed by the wrapper (less their
    DataLoaders' time), data = its constructor (reads the dataset, the teacher, builds the test loaders)
    plus every loader's iterator start and ``__next__``; the rest (per-training setup, lr search loop,
    model building, logging, CSV writing) is python/other."""
    clock = raw.get("clock") or {}
    return _parts(raw["wall_seconds"], clock.get("train", 0.0), clock.get("test", 0.0),
                  raw["setup_seconds"] + clock.get("data", 0.0), constructor=raw["setup_seconds"],
                  epochs=clock.get("train_calls"), test_passes=clock.get("test_calls"))


def _num(v) -> float:
    return 0.0 if v is None or v != v else float(v)


def time_breakdown(results: dict, protocols: list[str]) -> dict:
    """Seconds per side and protocol: training, test passes, data loading, python/other (sums to wall)."""
    out = {"unit": "seconds", "what": "train: training steps; test: test passes; data: data loading "
                                     "(ddlib: opening the cell; peer: its constructor + DataLoader iteration); "
                                     "python_other: the rest of the wall time (the ratios' wall)"}
    for p in protocols:
        if p in results.get("ours", {}):
            out.setdefault("ddlib", {})[p] = ours_breakdown(results["ours"][p])
    for side in ("peer", "peer_defaults"):
        block = results.get(side) or {}
        for p in protocols:
            if isinstance(block.get(p), dict) and "wall_seconds" in block[p]:
                out.setdefault(side, {})[p] = peer_breakdown(block[p])
    return out


def accuracies(results: dict, protocols: list[str]) -> dict:
    """Mean over seeds of each accuracy and score, per side and protocol (fractions of the test set)."""
    out = {}
    for side, key in (("ddlib", "ours"), ("peer", "peer"), ("peer_defaults", "peer_defaults")):
        block = results.get(key) or {}
        for p in protocols:
            rows = (block.get(p) or {}).get("per_seed") if isinstance(block.get(p), dict) else None
            if not rows:
                continue
            score = SCORE[p] if side == "ddlib" else "score_ddlib_formula"
            cols = {k: [r.get(k) for r in rows] for k in [*ACC_KEYS[p], score]}
            out.setdefault(side, {})[p] = {**{k: _mean(v) for k, v in cols.items() if k != score},
                                           "score": _mean(cols[score]), "seeds": [r.get("seed") for r in rows]}
    return out


def _mean(values) -> float | None:
    vals = [float(v) for v in values if v is not None and v == v]
    return round(sum(vals) / len(vals), 5) if vals else None


def write_record(results: dict, protocols: list[str], device: str, path: Path | None = None) -> Path:
    """The short record: ratios, accuracies, time breakdown, machine and commit at the top level."""
    path = path or RECORDS / f"vs_ddranking_{device}.json"
    s = results["settings"]
    record = {
        "benchmark": "vs_ddranking", "device": device, "date": results.get("date"),
        "commit": results["machine"].get("commit"), "partial": results.get("partial"),
        "ratio_defaults": results.get("ratio_defaults"), "ratio_matched": results.get("ratio_matched"),
        "ratios": results.get("ratios"),
        "accuracy_unit": "fraction of the test set (0-1); score: LRS/ARS on 0-100 (ddlib's formula, on the peer's "
                         "own accuracies for the peer)",
        "accuracies": accuracies(results, protocols),
        "time_breakdown": results.get("time_breakdown") or time_breakdown(results, protocols),
        "machine": results["machine"], "peer_env": results.get("peer_env"),
        "workload": {k: s.get(k) for k in ("seeds", "epochs", "teacher_epochs", "train_per_class", "test_size",
                                           "peer_defaults", "precision", "store", "lr_select", "lr_grid", "device",
                                           "threads")},
        "same_images": (results.get("data") or {}).get("same_images"),
        "teacher": results.get("teacher"), "total_seconds": results.get("total_seconds"),
        "full_results": str(results.get("out")),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=str))
    return path


class Budget:
    """Seconds one call may take (``--budget-seconds``; None: no limit), counted from the script's start.
    A step starts only when the time left exceeds its lower-bound estimate; a started peer run gets
    the time left as its timeout, so a call always ends with a JSON."""

    def __init__(self, seconds: float | None, start: float):
        self.seconds, self.start = seconds, start
        self.skipped: list[dict] = []

    def left(self) -> float | None:
        return None if self.seconds is None else self.seconds - (time.perf_counter() - self.start)

    def allows(self, step: str, estimate: float) -> bool:
        left = self.left()
        if left is None or left > estimate:
            return True
        self.skipped.append({"step": step, "seconds_left": round(left, 1), "estimate_seconds": round(estimate, 1)})
        return False


# --------------------------------------------------------------------------- tables and defects


def _ms(values) -> tuple[float, float]:
    vals = [float(v) for v in values]
    if not vals:
        return float("nan"), float("nan")
    m = sum(vals) / len(vals)
    return m, math.sqrt(sum((v - m) ** 2 for v in vals) / len(vals))


def defects(peer: dict, cfg: dict, pins: list[str]) -> list[dict]:
    """Every peer defect met (``hit``: in this workload's path; else latent), with the evidence."""
    c, p = peer.get("citations", {}), peer.get("probes", {})
    imports = peer.get("imports", {})
    out = []

    def add(id_, title, hit, evidence, effect, workaround):
        out.append({"id": id_, "title": title, "hit": hit, "evidence": evidence, "effect": effect,
                    "workaround": workaround})

    add("md5-download", "CIFAR-10 is opened with download=True and torchvision's md5 check", True,
        [c.get("download_true"), p.get("torchvision_md5_check_on_reencoded_cifar")],
        "Any CIFAR-10 copy that is not byte-identical to the official archive (here CIFAR-10 (JPEG), re-encoded) is "
        "refused ('Dataset not found or corrupted'), and download=True would try to fetch the archive from the "
        "internet; the peer cannot score on the data the suite uses.",
        "wrapper: torchvision.datasets.cifar.check_integrity patched to return True")
    add("clock-seed", "every evaluation run is seeded from the wall clock", True,
        [c.get("clock_seed"), c.get("set_seed_called_without_seed_lrs"), c.get("set_seed_called_without_seed_ars"),
         p.get("set_seed_without_argument")],
        "set_seed() is called without a seed once per evaluation run, so seed = int(time.time()*1000) % 1000000: "
        "results are not reproducible and cannot be paired with another tool's seeds.",
        "wrapper: set_seed replaced in the metric modules so that evaluation run i uses the i-th seed of the workload")
    add("lr-on-test", "learning rate chosen by test accuracy", True,
        [c.get("lr_grid_best_test_acc_lrs"), c.get("test_loader_is_test_split")],
        "Every accuracy (hard and soft, distilled and random, every evaluation run) is the best of 5 trainings "
        "(lr 0.001..0.1) judged on the test set: an optimistic, test-selected number.",
        "none in the peer (it is its method); ddlib was run with lr_select='test' to mirror it (tagged as such in "
        "MLflow; ddlib's default is a held-out validation split)")
    add("best-epoch-on-test", "test every 20 epochs and keep the best; 0 when num_epochs < 20", True,
        [c.get("test_interval"), c.get("best_epoch_on_test_lrs"), p.get("fewer_epochs_than_test_interval_returns_0")],
        "Accuracies are the maximum over periodic test evaluations (another test-set selection); with fewer than 20 "
        "epochs (or the last epochs past a multiple of 20) the model is never tested and the reported accuracy is "
        "0.0 (or ignores those epochs), silently.",
        f"wrapper (matched mode): test_interval set to num_epochs ({cfg['epochs']}) on each evaluator (one test after the last "
        "epoch, as ddlib)")
    add("percent-scores", "LRS and ARS computed from percentage points", True,
        [c.get("accuracy_percent"), c.get("lrs_formula_percent"), c.get("lrs_exp"), c.get("ars_formula_percent"),
         c.get("ars_exp"), {"lrs_returned": (peer.get("lrs") or {}).get("returned"),
                            "ars_returned": (peer.get("ars") or {}).get("returned")}],
        "Accuracies are in percent, so HLR/IOR are in points and alpha = w*IOR - (1-w)*HLR ranges over [-100, 100] "
        "instead of [-1, 1]: (e^alpha - e^-1)/(e - e^-1) then leaves [0, 1] (negative for any HLR above a few "
        "points, astronomically large for IOR above ~20 points), and the log prints it with a '%'.",
        "none in the peer; the comparison also reports ddlib's formula applied to the peer's own accuracies "
        "(score_ddlib_formula)")
    add("random-format-default", "LabelRobustScoreSoft's default random_data_format is rejected by its own code",
        True, [c.get("random_format_default_lrs"), c.get("random_format_checked_lrs"),
               p.get("lrs_default_random_data_format")],
        "With the default ('tensors') compute_metrics raises ValueError when it reaches the random subset, after "
        "the distilled set's trainings.",
        "wrapper: random_data_format='tensor'")
    add("random-tensors-arguments", "get_random_data_tensors called with its arguments shifted", True,
        [c.get("random_tensors_call_lrs"), c.get("random_tensors_signature"), p.get("lrs_random_data_format_tensor"),
         p.get("ars_random_data_format_tensor")],
        "random_data_format='tensor' always crashes: eval_iter is passed as class_map (TypeError: 'int' object is not "
        "subscriptable).",
        "wrapper: get_random_data_tensors replaced in both metric modules by one returning ddlib's random subset "
        "(baseline_seed 0, sorted class-major), so both tools train the same random images")
    add("random-format-image", "random_data_format='image' re-encodes the random subset as JPEG and needs a transform",
        False, [p.get("lrs_random_data_format_image_without_custom_train_trans")],
        "The only working format writes the random images to ./random_data as JPEG (lossy, while the distilled set "
        "stays float) and reads them back through custom_train_trans, which defaults to None and then crashes in "
        "the DataLoader; ARS applies custom_train_trans to the random side only.",
        "not used (tensor format with the replaced sampler)")
    add("mode-S-teacher", "soft_label_mode='S' (stored soft labels) crashes on the random subset", False,
        [c.get("teacher_model_singular_lrs"), p.get("lrs_soft_label_mode_S_teacher_labels")],
        "LabelRobustScoreSoft._generate_soft_labels calls self.teacher_model, which does not exist (the teachers "
        "are self.teacher_models): AttributeError.",
        "not used (this workload relabels online, mode 'M')")
    add("loss-kwargs-none", "LabelRobustScoreSoft's default loss_fn_kwargs=None crashes", True,
        [c.get("loss_kwargs_default_none"), p.get("lrs_loss_fn_kwargs_default_none")],
        "KLDivergenceLoss(**None): TypeError at the first soft-label training.",
        f"wrapper: loss_fn_kwargs={{'temperature': {cfg['temperature']}, 'scale_loss': False}}")
    add("ars-step-scheduler", "AugmentationRobustScore crashes with lr_scheduler='step'", True,
        [c.get("ars_scheduler_without_step_size"), c.get("step_scheduler_asserts"), p.get("ars_step_scheduler")],
        "The ARS trainings call get_lr_scheduler without step_size; 'step' (the DC/DSA/DM recipe) asserts.",
        "both tools use cosine annealing (peer 'cosineannealing' = torch CosineAnnealingLR = ddlib 'cosine')")
    add("ars-hard-labels", "AugmentationRobustScore with label_type='hard' crashes", False,
        [c.get("ars_hard_uses_missing_test_loader"), c.get("ars_deletes_test_loader"), p.get("ars_label_type_hard")],
        "The hard-label path passes self.teacher_models (never set for hard labels) and validates on "
        "self.test_loader_real (deleted in __init__): AttributeError.",
        "not used (soft labels)")
    add("real-acc-cache", "no cached full-data accuracy for CIFAR-10; the full-data run mixes two configs", True,
        [c.get("real_acc_cache"), c.get("real_epochs_from_soft_config"), p.get("real_data_acc_cache_keys")],
        "eval_full_data=False raises ValueError for CIFAR10 (only ImageNet1K and TinyImageNet are cached); with "
        "True, the full-data model is retrained in every evaluation run for num_epochs of the distilled-set config "
        "while its optimizer and StepLR(100) come from REAL_DATA_TRAINING_CONFIG (200 epochs): with fewer than "
        "100 epochs its lr never decays.",
        "wrapper: eval_full_data=True; ddlib's real_recipe set to the same constant lr 0.01 (scheduler none)")
    add("class-major-assumption", "labels are never read: the set is assumed sorted class-major", False,
        [c.get("hard_labels_class_major")],
        "compute_metrics takes no labels: hard labels are rebuilt as [0]*ipc + [1]*ipc + ...; a set stored in any "
        "other order is silently mislabelled.",
        "the DC file is class-major (checked); the random subset handed to the peer is sorted class-major")
    add("missing-teacher", "no teacher training; a missing checkpoint crashes", True,
        [c.get("pretrained_path_none")],
        "Teachers must exist as <teacher_dir>/<dataset>/<model>/ckpt_best.pt; otherwise the path is None and "
        "torch.load(None) fails. The package cannot make one.",
        "ddlib trains the teacher (get_teachers) and the script writes its state_dict where the peer looks")
    add("cwd-writes", "results and random subsets written into the current directory", True,
        ["save_path default ./results/<dataset>/<model>/ipc<ipc>/...; random_data_path default ./random_data/..."],
        "Running the peer litters the working directory.",
        "wrapper: runs in a temporary working directory")
    add("requirements", "declared requirements differ from what the code imports", True,
        [{"imported_but_not_declared": imports.get("imported_but_not_declared"),
          "declared_but_never_imported": imports.get("declared_but_never_imported"),
          "declared": imports.get("declared_requires")}],
        "pyyaml (ddranking.config) is imported but not declared: 'import ddranking' fails without it; scipy is "
        "declared but never imported; numpy<2.0.0 is declared (so pandas 3, which needs numpy>=2, cannot be used).",
        "venv: pip install --no-deps ddranking==0.2.0, then " + " ".join(pins))
    add("dataloader-workers", "num_workers=4 by default, re-forked every epoch", True,
        ["DataLoader(..., num_workers=num_workers) built per training, no persistent_workers"],
        "On a 2-core CPU each epoch of a 100-image set forks 4 worker processes.",
        "both peer evaluators run with num_workers=0 (ddlib keeps tensors on the device and has no loader)")
    add("mislabelled-log", "ARS log lines are mislabelled", True, [c.get("ars_mislabelled_log")],
        "The random subset's with-augmentation accuracy is printed as 'Without augmentation acc'.", "none needed")
    add("teacher-autograd", "teacher forward passes record autograd graphs", True, [c.get("teacher_forward_with_autograd")],
        "In mode 'M' the teachers run outside torch.no_grad() with requires_grad parameters: every batch builds "
        "a graph that is never used (time and memory).", "none (performance only)")
    return out


def defaults_table(results: dict, protocols: list[str]) -> str:
    """The peer at its defaults beside the matched mode: accuracies, wall time, the ratio to ddlib."""
    keys = {"lrs": ["acc_syn_hard", "acc_real_hard", "acc_syn_any", "acc_rdm_any"],
            "ars": ["acc_syn_aug", "acc_rdm_aug", "acc_syn_noaug", "acc_rdm_noaug"]}
    row = "{:<34} {:>18} {:>18} {:>18}"
    lines = ["\nDD-Ranking at its defaults (test every 20 epochs, best kept; 4 loader workers) vs matched"]
    lines.append(row.format("", "ddlib", "peer matched", "peer defaults"))
    for p in protocols:
        ours, matched, dflt = results["ours"][p], results["peer"][p], results["peer_defaults"][p]
        for k in keys[p]:
            lines.append(row.format(f"{p.upper()} {k}", fmt(*_ms([r[k] for r in ours["per_seed"]])),
                                    fmt(*_ms([r[k] for r in matched["per_seed"]])),
                                    fmt(*_ms([r[k] for r in dflt["per_seed"]]))))
        lines.append(row.format(f"{p.upper()} wall seconds", f"{ours['wall_seconds']:.0f}",
                                f"{matched['wall_seconds']:.0f}", f"{dflt['wall_seconds']:.0f}"))
    return "\n".join(lines)


def fmt(mean: float, std: float, scale: float = 100.0, digits: int = 1) -> str:
    if mean != mean:
        return "n/a"
    return f"{mean * scale:.{digits}f} ± {std * scale:.{digits}f}"


def table(results: dict) -> str:
    lines = []
    row = "{:<34} {:>18} {:>18} {:>22}"
    for protocol, keys in (("lrs", ["acc_syn_hard", "acc_real_hard", "acc_syn_any", "acc_rdm_any", "hlr", "ior"]),
                           ("ars", ["acc_syn_aug", "acc_rdm_aug", "acc_syn_noaug", "acc_rdm_noaug", "ior_aug", "ior_noaug"])):
        if protocol not in results["ours"]:
            continue
        ours, peer = results["ours"][protocol], results["peer"].get(protocol)
        name = "LRS" if protocol == "lrs" else "ARS"
        lines.append(f"\n{name} (accuracies and differences in %, points; scores 0-100 unless marked)")
        lines.append(row.format("", "ddlib", "DD-Ranking", "DD-Ranking note"))
        for k in keys:
            o = _ms([r[k] for r in ours["per_seed"]])
            pv = _ms([r[k] for r in peer["per_seed"]]) if peer else (float("nan"), float("nan"))
            note = ""
            if k in ("acc_syn_hard",) and peer:
                note = "best of 5 lr on test"
            if k in ("acc_syn_any", "acc_rdm_any", "acc_syn_aug", "acc_rdm_aug", "acc_syn_noaug", "acc_rdm_noaug"):
                note = "best of 5 lr on test" + (" (ddlib too)" if results["settings"]["lr_select"] == "test" else "")
            lines.append(row.format(k, fmt(*o), fmt(*pv), note))
        if peer and protocol == "lrs":
            pv = _ms([r["acc_syn_hard_at_lr0.01"] for r in peer["per_seed"]])
            lines.append(row.format("acc_syn_hard (peer at lr 0.01)", "", fmt(*pv), "same lr as ddlib"))
        score = "lrs" if protocol == "lrs" else "ars"
        o = _ms([r[score] for r in ours["per_seed"]])
        lines.append(row.format(f"{name} (ddlib formula)", fmt(*o, scale=1.0, digits=2),
                                fmt(*_ms([r["score_ddlib_formula"] for r in peer["per_seed"]]), scale=1.0, digits=2)
                                if peer else "n/a", "peer accuracies"))
        if peer:
            raw = [r.get("score_peer", float("nan")) for r in peer["per_seed"]]
            lines.append(row.format(f"{name} (as the peer reports it)", "",
                                    fmt(*_ms(raw), scale=1.0, digits=4), "percent-scale defect"))
        lines.append(row.format("wall seconds", f"{ours['wall_seconds']:.0f}",
                                f"{peer['wall_seconds']:.0f}" if peer else "n/a", "ddlib: teacher excluded"))
        lines.append(row.format("trainings", str(len(ours["trials"])), str(len(peer["trials"])) if peer else "n/a",
                                "models trained"))
        o_each = _ms([t["train_seconds"] + t["eval_seconds"] for t in ours["trials"]
                      if t["role"] != "real_hard" and _num(t["train_seconds"]) > 0])  # not an lr search's summary
        p_each = _ms([t["seconds"] for t in peer["trials"] if t["side"] != "real"]) if peer else (float("nan"),) * 2
        lines.append(row.format("s per 100-image training", fmt(*o_each, scale=1.0), fmt(*p_each, scale=1.0),
                                "train + test"))
        if peer:
            lines.append(row.format("load average before/after", "/".join(map(str, ours["load_average_before_after"])),
                                    "/".join(map(str, results["peer_load_average_before_after"])), "both peer protocols"))
    return "\n".join(lines)


def breakdown_table(tb: dict) -> str:
    row = "{:<26} {:>8} {:>8} {:>8} {:>8} {:>13}"
    lines = ["\nwhere the time goes (s)", row.format("", "wall", "train", "test", "data", "python/other")]
    for side in ("ddlib", "peer", "peer_defaults"):
        for p, b in (tb.get(side) or {}).items():
            lines.append(row.format(f"{side} {p}", *(f"{b[k]:.1f}" for k in ("wall", "train", "test", "data",
                                                                              "python_other"))))
    return "\n".join(lines)
