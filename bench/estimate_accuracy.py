#!/usr/bin/env python
"""How close a first dry run's time estimate comes to the real time (issue 53): for every protocol, a
small real cell on digits in an empty temporary store and an empty feature cache (the machine's
calibration, ``calibration.json``, is kept: it is measured once per machine), its estimate
(``python -m ddlib run GRID --dry-run``: :func:`ddlib.run.plan.plan_grid`) against the wall time of
``python -m ddlib run GRID``. The ratio estimate / real should stay within 1.5 either way. Writes
bench/results/estimate_accuracy.json and prints a summary with the machine (CPU model, flags,
threads) and its load before and after each cell.

    python bench/estimate_accuracy.py                         # every cell (~20-30 min on a loaded 2-core CPU)
    python bench/estimate_accuracy.py --only label_robust adversarial
    python bench/estimate_accuracy.py --full                  # also the issue's default label_robust cell, one seed
    DDLIB_NUM_THREADS=1 python bench/estimate_accuracy.py     # the threads each cell trains with

The cells use ``ddlib score --quick``'s settings (:data:`ddlib.scoring.QUICK`) where the protocol has
them, plus a label_robust cell whose set comes from forgetting scores (a selection network), one
under the DSA preset, and a NAS cell of five architectures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import machine_info, write_results  # noqa: E402  (bench/machine.py)

from ddlib.scoring import QUICK  # noqa: E402

GROUND_TRUTH = Path("/work/shared/data/nasbench201-accuracy.csv")


def cells(set_path: str, full: bool = False) -> dict[str, dict]:
    """name -> a one-cell params grid on digits (``full``: also the issue's default cell, one seed)."""
    mine = {"mine": {"kind": "file", "path": set_path}}

    def grid(protocol: str, params: dict, method: str = "mine", ipc: int = 1, methods: dict | None = None) -> dict:
        return {"protocol": protocol, "params": {"dataset": "digits", **params},
                "grid": {"method": [method], "ipc": [ipc]}, "methods": mine if methods is None else methods}

    out = {name: grid(name, QUICK[name]) for name in ("label_robust", "augmentation_robust", "adversarial", "augmentation",
                                                       "transfer", "compression", "privacy")}
    out["blackbox"] = grid("blackbox", QUICK["blackbox"])
    out["label_robust forgetting"] = grid("label_robust", {**QUICK["label_robust"], "lr_policy": "fixed"}, "forgetting",
                                          methods={"forgetting": {"kind": "forgetting", "epochs": 10}})
    out["label_robust dsa preset"] = grid("label_robust", {**QUICK["label_robust"], "preset": "dsa"})
    if full:  # the first score: 300 epochs, a 5-lr search per side, a 300-epoch full-data reference
        out["label_robust defaults, 1 seed"] = grid("label_robust", {"seeds": [0]})
    if GROUND_TRUTH.is_file():
        out["nas"] = grid("nas", {"seeds": [0], "num_archs": 5, "recipe": {"epochs": 10},
                                  "ground_truth": str(GROUND_TRUTH), "gt_column": "CIFAR10TestAccuracy200Epochs"},
                          "random", 10, methods={})
    return out


def plan_json(path: str) -> int:
    """The dry run's plan of a one-cell grid, as JSON on stdout (run in a fresh process by :func:`measure`)."""
    from ddlib.run.plan import plan_grid

    started = time.perf_counter()
    plan = plan_grid(path)
    cell = plan.cells[0]
    machine = plan.machines[0]
    print(json.dumps({"minutes": cell.minutes, "basis": cell.basis, "models": cell.count.line() if cell.count else None,
                      "start_seconds": round(machine.start_seconds(), 1),
                      "plan_seconds": round(time.perf_counter() - started, 1), "calibrated": machine.calibrated,
                      "pace": machine.pace, "pace_one_thread": machine.pace_one, "threads": machine.threads,
                      "machine": machine.describe()}))
    return 0


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def measure(name: str, grid: dict, work: Path, calibration: Path | None) -> dict:
    """Plan the cell in an empty store, then run it, each in a fresh process; their numbers."""
    import yaml

    store, cache = work / f"store-{abs(hash(name))}", work / f"cache-{abs(hash(name))}"
    cache.mkdir(parents=True)
    if calibration is not None and calibration.is_file():
        shutil.copy(calibration, cache / calibration.name)
    path = work / f"{name.replace(' ', '_')}.yaml"
    path.write_text(yaml.safe_dump(grid))
    env = {**os.environ, "DDLIB_MLRUNS": str(store), "DDLIB_CACHE": str(cache)}
    env.pop("MLFLOW_TRACKING_URI", None)
    row = {"cell": name, "protocol": grid["protocol"], "params": grid["params"], "load_before": _load()}
    planned = subprocess.run([sys.executable, __file__, "--plan", str(path)], capture_output=True, text=True, env=env)
    if planned.returncode != 0:
        return {**row, "error": planned.stderr[-2000:]}
    row["plan"] = json.loads(planned.stdout.strip().splitlines()[-1])
    if calibration is not None and (cache / calibration.name).is_file():  # what the plan calibrated, for later cells
        shutil.copy(cache / calibration.name, calibration)
    row["load_start"] = _load()
    started = time.perf_counter()
    ran = subprocess.run([sys.executable, "-m", "ddlib", "run", str(path)], capture_output=True, text=True, env=env,
                         cwd=ROOT)
    row["real_seconds"] = round(time.perf_counter() - started, 1)
    row["load_after"] = _load()
    if ran.returncode != 0:
        return {**row, "error": (ran.stderr or ran.stdout)[-2000:]}
    minutes = row["plan"]["minutes"]
    row["estimate_seconds"] = round(60 * minutes, 1) if minutes is not None else None
    row["ratio"] = round(row["estimate_seconds"] / row["real_seconds"], 2) if minutes is not None else None
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", help="cells whose name starts with one of these")
    ap.add_argument("--full", action="store_true", help="also label_robust at its defaults, one seed (minutes)")
    ap.add_argument("--plan", help=argparse.SUPPRESS)  # internal: print one grid's plan as JSON
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "estimate_accuracy.json")
    args = ap.parse_args(argv)
    if args.plan:
        return plan_json(args.plan)
    from ddlib.store.cache import cache_dir
    from ddlib.data.datasets import load_dataset
    from ddlib.methods.select import random_subset

    import numpy as np

    out = {"benchmark": "estimate_accuracy", "date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine_info("cpu"),
           "threads_env": os.environ.get("DDLIB_NUM_THREADS"), "cells": []}
    calibration = cache_dir() / "calibration.json"
    with tempfile.TemporaryDirectory(prefix="ddlib-estimate-") as tmp:
        work = Path(tmp)
        subset = random_subset(load_dataset("digits"), 1, seed=3)
        set_path = work / "my_digits.npz"
        np.savez(set_path, images=subset.images.numpy(), labels=subset.labels.numpy())
        for name, grid in cells(str(set_path), args.full).items():
            if args.only and not name.startswith(tuple(args.only)):
                continue
            row = measure(name, grid, work, calibration)
            out["cells"].append(row)
            shown = (f"estimate {row['estimate_seconds']:.0f} s, real {row['real_seconds']:.0f} s, ratio {row['ratio']}"
                     if row.get("ratio") is not None else f"ERROR {row.get('error', '')[-300:]}")
            print(f"{name:28s} {shown} (load {row['load_before']} -> {row.get('load_after')})", flush=True)
    ratios = [r["ratio"] for r in out["cells"] if r.get("ratio")]
    out["within_1.5"] = all(1 / 1.5 <= r <= 1.5 for r in ratios) if ratios else None
    out["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    m = out["machine"]
    print(f"{m['cpu_model']} (family/model {m['cpu_family_model']}, {', '.join(m['cpu_flags'])}), {m['cpu_count']} CPUs, "
          f"threads per cell {out['threads_env'] or 'all'}; ratios {ratios}: "
          + ("all within 1.5x" if out["within_1.5"] else "NOT all within 1.5x"))
    write_results(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
