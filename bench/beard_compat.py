"""A released BEARD checkpoint attacked in pixel space and in BEARD's own pipeline, beside BEARD's log.

    python bench/beard_compat.py --checkpoint ../BEARD/Code/model_pool/BACON/BACON_ConvNet_CIFAR10_50_None_0.6995.pth
    python bench/beard_compat.py --checkpoint ... --attack-size 1000 --attacks fgsm pgd pgd_l2   # a CPU run
    python bench/beard_compat.py --checkpoint ... --attack-size 0                                  # all 10,000 (GPU)
    python bench/beard_compat.py --checkpoint ... --attack-size 400 --attacks fgsm --modes untargeted \
        --curve-eps 0 2 4 8                                             # robustness curves, eps in 1/255

The checkpoint (a ConvNet state_dict from BEARD's ``Code/model_pool``; nothing is downloaded) goes
through the ``adversarial`` protocol as ``source: {kind: checkpoint}``, in a scratch MLflow store,
once per space (``pixel``, ``beard_compat``) and mode, with BEARD's attack parameters (PGD step
2/225 as BEARD ran it). Prints each attack's robust accuracy in both spaces next to the value of
BEARD's released white-box log for BACON, ConvNet, CIFAR-10, IPC 50, and writes
bench/results/beard_compat.json with the machine and its load. Our CIFAR-10 is a JPEG re-encoding
and a subset is a sample of the test set, so the match to BEARD's log is close, not exact.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEARD_ATTACKS = {  # BEARD's eva_utils.epoch parameters
    "fgsm": {"fgsm": {"eps": "8/255"}},
    "pgd": {"pgd": {"eps": "8/255", "alpha": "2/225", "steps": 10, "random_start": False}},
    "pgd_l2": {"pgd_l2": {"eps": "128/255", "alpha": "15/255", "steps": 10, "random_start": False}},
    "cw": {"cw": {"c": 1, "kappa": 0, "steps": 100, "lr": 0.01}},
    "deepfool": {"deepfool": {"steps": 50, "overshoot": 0.02}},
    "autoattack": {"autoattack": {"eps": "8/255"}},
}
# BEARD's released log, Code/metrics/white_box/BACON/ConvNet_CIFAR10_50_evaluation_log.txt (percent)
BEARD_LOG_BACON_IPC50 = {
    "clean": 69.95,
    "untargeted": {"fgsm": 38.16, "pgd": 28.86, "pgd_l2": 50.80, "deepfool": 18.28, "cw": 8.31, "autoattack": 27.00},
    "targeted": {"fgsm": 44.68, "pgd": 45.59, "pgd_l2": 50.81, "cw": 44.71},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="a ConvNet state_dict from BEARD's Code/model_pool")
    parser.add_argument("--method", default="bacon")
    parser.add_argument("--ipc", type=int, default=50)
    parser.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data" / "cifar10-jpeg.tar.gz"))
    parser.add_argument("--attack-size", type=int, default=1000, help="test images (0: all)")
    parser.add_argument("--attacks", nargs="+", default=["fgsm", "pgd", "pgd_l2"], choices=sorted(BEARD_ATTACKS))
    parser.add_argument("--modes", nargs="+", default=["untargeted", "targeted"])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--curve-eps", nargs="+", type=float, default=None,
                        help="an eps_curve of FGSM and PGD (BEARD's parameters) at these eps (x 1/255)")
    parser.add_argument("--expected-accuracy", default=None,
                        help="in %%, or unknown: for a file whose name carries none (BEARD's DC: 54.31, DM: 62.06)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "beard_compat.json"))
    args = parser.parse_args()

    store = Path(tempfile.mkdtemp(prefix="ddlib-bench-"))
    os.environ["DDLIB_MLRUNS"] = str(store)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{store / 'mlflow.db'}"
    sys.path.insert(0, str(ROOT))
    from ddlib.protocols import adversarial

    source = {"kind": "checkpoint", "path": str(Path(args.checkpoint).expanduser().absolute()), "model": "convnet"}
    if args.expected_accuracy is not None:
        source["expected_accuracy"] = args.expected_accuracy if args.expected_accuracy == "unknown" \
            else float(args.expected_accuracy)
    curve = None if args.curve_eps is None else {
        "attacks": [BEARD_ATTACKS["fgsm"], BEARD_ATTACKS["pgd"]], "eps": [f"{e:g}/255" for e in args.curve_eps]}
    common = dict(dataset="cifar10", data_root=args.data_root, method=args.method, source=source, ipc=args.ipc,
                  seeds=[0], attacks=[BEARD_ATTACKS[a] for a in args.attacks], device=args.device,
                  attack_size=args.attack_size or None, eps_curve=curve)
    result = {"checkpoint": str(args.checkpoint), "attack_size": args.attack_size or "all", "attacks": args.attacks,
              "machine": platform.machine(), "cpu_count": os.cpu_count(), "load_before": os.getloadavg(),
              "beard_log_bacon_ipc50": BEARD_LOG_BACON_IPC50, "cells": []}
    start = time.perf_counter()
    for mode in args.modes:
        for space in ("pixel", "beard_compat"):
            cell = adversarial.open_cell(**common, mode=mode, space=space)
            models = adversarial.train_models(cell, None)
            out = adversarial.evaluate(cell, None, models)
            cell.close()
            row = out.per_seed.iloc[0]
            entry = {"mode": mode, "space": space, "clean_acc": row.clean_acc,  # a result's accuracies are in %
                     "test_accuracy_full": 100 * models[0].accuracy, "rr": row.rr, "ae": row.ae, "crei": row.crei,
                     "device": cell.tracker.client.get_run(cell.run_id).data.tags.get("ddlib.device_name"),
                     "attacks": {a: {"robust_acc": row[f"{a}.robust_acc"], "max_linf": row[f"{a}.max_linf"],
                                     "attack_seconds": row[f"{a}.attack_seconds"],
                                     "clean_seconds": row[f"{a}.clean_seconds"]}
                                 for a in args.attacks if f"{a}.robust_acc" in row},
                     "curve": {k: row[k] for k in row.index if k.startswith(("curve.", "curve_auc."))}}
            result["cells"].append(entry)
            print(f"{mode:>10} {space:>12}: clean {entry['clean_acc']:.2f} % (full test set "
                  f"{entry['test_accuracy_full']:.2f} %)", flush=True)
    result["seconds"] = time.perf_counter() - start
    result["load_after"] = os.getloadavg()

    print(f"\n{'mode':>10} {'attack':>10} {'pixel %':>8} {'compat %':>9} {'BEARD log %':>12}"
          "  (max L-inf, pixels: pixel / compat)")
    for mode in args.modes:
        cells = {c["space"]: c for c in result["cells"] if c["mode"] == mode}
        for attack in args.attacks:
            if attack not in cells["pixel"]["attacks"]:
                continue
            p, c = cells["pixel"]["attacks"][attack], cells["beard_compat"]["attacks"][attack]
            logged = BEARD_LOG_BACON_IPC50[mode].get(attack)
            print(f"{mode:>10} {attack:>10} {p['robust_acc']:8.2f} {c['robust_acc']:9.2f} "
                  f"{'' if logged is None else f'{logged:.2f}':>12}  ({p['max_linf'] * 255:.1f}/255 / "
                  f"{c['max_linf'] * 255:.1f}/255)")
    if curve:
        _print_curves(result["cells"], args.curve_eps)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"\n{result['seconds']:.0f} s; load {result['load_before'][0]:.1f} before, {result['load_after'][0]:.1f} "
          f"after; written to {args.out}")


def _print_curves(cells: list[dict], eps: list[float]) -> None:
    """Each curve's points (%), its area, and the area it would have with the clean accuracy at eps 0
    (what ddlib logged there before issue 54; in beard_compat space it is not BEARD's pipeline's point)."""
    from ddlib.scores.robustness import curve_auc

    print(f"\n{'mode':>10} {'space':>12} {'attack':>6} " + " ".join(f"{e:>6g}" for e in eps)
          + "   auc  auc (clean at 0)")
    for cell in cells:
        for attack in ("fgsm", "pgd"):
            points = [cell["curve"][f"curve.{attack}.{e / 255:.6f}"] for e in eps]
            at_clean = [cell["clean_acc"] if e == 0 else p for e, p in zip(eps, points)]
            print(f"{cell['mode']:>10} {cell['space']:>12} {attack:>6} " + " ".join(f"{p:6.2f}" for p in points)
                  + f" {curve_auc(eps, points):6.2f} {curve_auc(eps, at_clean):6.2f}")


if __name__ == "__main__":
    main()
