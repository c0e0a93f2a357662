"""Wall time of a params grid end to end, and where it went. Writes bench/results/grid_<name>.json.

Times what `make demo` runs (``python -m ddlib run PARAMS --workers N --summary``: the grid, then the
summary printed and logged in the same process), on a scratch store unless ``--store`` names one.

    python bench/grid_time.py params/beard_cpu.yaml              # in a scratch MLflow store
    python bench/grid_time.py params/demo.yaml --workers 2
    python bench/grid_time.py params/beard_cpu.yaml --store /tmp/s --report-only   # a store already run

Reports the grid's wall time, each cell's, each trained model's training time, and for attack
protocols each attack's time (the times the protocols logged), plus the leaderboards' headline
numbers, so a run on another machine can be compared with the one in bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _store_env(store: Path) -> dict:
    env = {**os.environ, "DDLIB_MLRUNS": str(store)}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{store / 'mlflow.db'}"
    return env


def report(store: Path, experiment: str) -> dict:
    """Per-cell, per-model and per-attack times read back from the store."""
    os.environ.update(_store_env(store))
    sys.path.insert(0, str(ROOT))
    from ddlib.store import tracking
    out = {"cells": [], "models": [], "results": []}
    cells = tracking.runs(experiment, status=None, kind="cell")
    for _, run in cells.iterrows():
        seconds = (run["end_time"] - run["start_time"]).total_seconds() if run["end_time"] is not None else None
        out["cells"].append({"name": run["tags.mlflow.runName"], "status": run["status"], "wall_seconds": seconds})
    for _, run in tracking.runs(experiment, kind="eval").iterrows():
        out["models"].append({"role": run["tags.ddlib.role"], "model": run.get("params.model"),
                              "train_size": run.get("params.train_size"),
                              "test_accuracy": run["metrics.test_accuracy"],
                              "train_seconds": run["metrics.train_seconds"]})
    results = tracking.runs(experiment, kind="result")
    for _, run in results.iterrows():
        values = {k[len("metrics."):]: v for k, v in run.items() if k.startswith("metrics.") and v == v}
        out["results"].append({"name": run["tags.mlflow.runName"], **values})
    return out


def _children_cpu() -> float:
    """User + system CPU seconds of the waited-for child processes so far (workers and kernels
    included): on a shared machine a steadier measure of the work than the wall time."""
    times = os.times()
    return times.children_user + times.children_system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("params")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--store", help="MLflow folder to use (default: a scratch one, deleted afterwards)")
    parser.add_argument("--report-only", action="store_true", help="read an already-run store, run nothing")
    args = parser.parse_args()
    import yaml

    grid = yaml.safe_load(Path(args.params).read_text())
    experiment = grid.get("experiment") or grid["protocol"]
    name = Path(args.params).stem
    with tempfile.TemporaryDirectory(prefix="ddlib-bench-") as tmp:
        store = Path(args.store) if args.store else Path(tmp) / "mlruns"
        result = {"params": args.params, "workers": args.workers, "machine": platform.machine(),
                  "cpu_count": os.cpu_count(), "python": platform.python_version()}
        if not args.report_only:
            from machine import machine_info  # bench/machine.py, beside this script

            result["machine_info"] = machine_info("cpu")
            # what `make demo` runs: the grid, then (every cell finished) the summary, printed and logged, in
            # the same process. The grid's part is the runner's own timer ("finished ... (X s)").
            command = [sys.executable, "-m", "ddlib", "run", args.params, "--workers", str(args.workers), "--summary"]
            result["command"] = " ".join(["python", *command[1:]])
            result["load_before"] = os.getloadavg()
            start, cpu = time.perf_counter(), _children_cpu()
            shown = subprocess.run(command, cwd=ROOT, env=_store_env(store), stdout=subprocess.PIPE, text=True, check=False)
            result["run_and_summary_seconds"] = time.perf_counter() - start
            result["run_and_summary_cpu_seconds"] = _children_cpu() - cpu  # every process of it (load-independent-ish)
            result["exit_status"] = shown.returncode
            finished = re.search(r"^finished .*\(([0-9.]+) s\)$", shown.stdout, re.M)
            if finished:
                result["grid_seconds"] = float(finished[1])
                result["summary_seconds"] = result["run_and_summary_seconds"] - result["grid_seconds"]
            result["summary"] = shown.stdout
            result["load_after"] = os.getloadavg()
        result.update(report(store, experiment))
    out = ROOT / "bench" / "results" / f"grid_{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    if "run_and_summary_seconds" in result:
        print(f"{result['command']}: {result['run_and_summary_seconds']:.1f} s "
              f"({result['run_and_summary_cpu_seconds']:.0f} CPU-s, exit status {result['exit_status']}), of which the grid "
              f"{result.get('grid_seconds', float('nan')):.1f} s and the rest (the summary, the interpreter's start and "
              f"exit) {result.get('summary_seconds', float('nan')):.1f} s; load {result['load_before'][0]:.1f} -> "
              f"{result['load_after'][0]:.1f}")
    for cell in result["cells"]:
        print(f"  cell {cell['name']:<32} {cell['status']:<9} {cell['wall_seconds'] or float('nan'):8.1f} s")
    for model in result["models"]:
        print(f"  model {model['role']:<20} {model['model']!s:<10} n={model['train_size']!s:<6} "
              f"acc {100 * model['test_accuracy']:5.1f} %  train {model['train_seconds']:7.1f} s")
    for r in result["results"]:
        timing = r.get("attack_seconds", r.get("clean_seconds"))
        accuracy = r.get("robust_acc", r.get("clean_acc"))
        print(f"  {r['name']:<34} acc {100 * accuracy:5.1f} %  {timing:8.2f} s")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
