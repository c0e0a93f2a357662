#!/usr/bin/env python
"""What ``ddlib run`` costs per grid cell beyond the cell's own training and testing (issue 55, item 3):
each part of that fixed cost, for the first cell and the mean of the later ones a warm kernel runs.

    python bench/fixed_cost.py --device cpu --cells 4      # about 2 minutes on a 2-core CPU
    PYTHONPATH=/tmp/site:$PWD python3 bench/fixed_cost.py --device cuda --record

Runs a grid of ``--cells`` tiny cells (protocol ``augmentation`` on digits: a random IPC-2 set trained
2 epochs with and without DSA, one seed per cell) through ``ddlib run --workers 1`` (papermill, MLflow,
a scratch SQLite store in a temporary folder), so the second and later cells run in the first cell's
kept kernel. Every process of the run loads ``bench/fixed_cost_probe.py`` (as ``sitecustomize``), which
logs the seconds of the timed calls; nothing in ddlib is changed or told. Per cell, in seconds:

* ``process_start_imports`` (first cell): ``ddlib run`` launched to its worker's first cell, with the
  runner's and the worker's own parts; ``between_cells`` (later cells): the runner's gap before the cell;
* ``kernel_start`` (a fresh kernel: process, imports, ``kernel_info``) or ``kernel_reuse_prelude``
  (a kept kernel's ``%reset -f``, environment and running plan);
* in the notebook: ``cuda_init`` (the first CUDA call: context creation), ``notebook_imports``,
  ``dataset_load_and_move`` (``load_dataset``, ``reduce_dataset``, the device copies of the training
  and test sets), ``mlflow`` (every MLflow client call: run creation, params, tags, metrics,
  artifacts, the reuse look-ups, the run's end, in the worker and in the kernel), ``own_work``
  (``train_and_test``: training and testing, less the parts above nested in it), ``cell_open_close``
  (``Cell.open`` and ``close`` less the parts above: threads, the progress writer) and ``notebook_other``
  (papermill, the set, plots, what the notebook does between);
* ``worker_other``: the worker's remainder (notebook file, kernel client).

``fixed = cell wall - own_work`` (plus the process start for the first cell, the runner's gap for a later
one). Writes ``bench/results/fixed_cost_<device>.json`` (``--out``), with ``--record`` also
``bench/records/fixed_cost_<device>.json``, and prints a table. The target (issue 55): under 5 s per
later cell on the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_LATER_S = 5.0  # issue 55: a grid's second and later cells, on the GPU
PARAMS = {"dataset": "digits", "method": "random", "ipc": 2, "augmentations": ["none", "dsa"],
          "recipe": {"epochs": 2}, "aug_epochs": 2}
PARTS = ("process_start_imports", "between_cells", "kernel_start", "kernel_reuse_prelude", "cuda_init",
         "notebook_imports", "dataset_load_and_move", "mlflow", "own_work", "cell_open_close", "notebook_other",
         "worker_other")


def grid_file(folder: Path, device: str, cells: int) -> Path:
    import yaml

    grid = {"protocol": "augmentation", "experiment": "fixed_cost", "params": {**PARAMS, "device": device},
            "grid": {"seeds": [[seed] for seed in range(cells)]}}  # one seed per cell: every cell trains
    path = folder / "fixed_cost.yaml"
    path.write_text(yaml.safe_dump(grid, sort_keys=False))
    return path


def run_grid(folder: Path, device: str, cells: int) -> tuple[list[dict], float, float, str]:
    """Run the grid with the probe in every process: its events, launch time, wall seconds, output."""
    probe = folder / "probe"
    probe.mkdir()
    shutil.copy(Path(__file__).with_name("fixed_cost_probe.py"), probe / "sitecustomize.py")
    store, log = folder / "store", folder / "events.jsonl"
    store.mkdir()
    path = os.pathsep.join(p for p in (str(probe), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "DDLIB_FIXED_COST_LOG": str(log), "TQDM_DISABLE": "1",
           "DDLIB_MLRUNS": str(store), "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}"}
    env.pop("DDLIB_WARM_KERNEL", None)  # the default: warm kernels on
    argv = [sys.executable, "-m", "ddlib", "run", str(grid_file(folder, device, cells)), "--workers", "1"]
    launched = time.time()
    out = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.time() - launched
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {out.returncode}:\n{(out.stdout + out.stderr)[-4000:]}")
    events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return events, launched, wall, out.stdout[-2000:]


def _sum(events, part: str, start: float, end: float, roles=None, outside=()) -> float:
    """Exclusive seconds of ``part``'s calls that started in [start, end) (and in none of ``outside``)."""
    return sum(e["exclusive"] for e in events if e["event"] == "call" and e["part"] == part
               and start <= e["start"] < end and (roles is None or e["role"] in roles)
               and not any(a <= e["start"] < b for a, b in outside))


def _calls(events, part: str, role: str) -> list[dict]:
    return sorted((e for e in events if e["event"] == "call" and e["part"] == part and e["role"] == role),
                  key=lambda e: e["start"])


def analyse(events: list[dict], launched: float, wall: float) -> list[dict]:
    """Seconds of each part, per cell, from the probe's events (module docstring)."""
    cells = [e for e in _calls(events, "cell", "worker") if e["depth"] == 0]
    kernel_fors = [e for e in _calls(events, "kernel", "worker") if e["name"] == "kernel_for"]
    notebooks = _calls(events, "notebook", "worker")
    created = {e["role"]: e.get("created") or e["t"] for e in events if e["event"] == "process"}
    rows, previous_end = [], None
    for i, cell in enumerate(cells):
        start, end = cell["start"], cell["start"] + cell["total"]
        kernel = next(e for e in kernel_fors if start <= e["start"] < end)
        notebook = next(e for e in notebooks if start <= e["start"] < end)
        nb_start, nb_end = notebook["start"], notebook["start"] + notebook["total"]
        fresh = kernel["cells_in_kernel"] == 1
        kernel_parts = {p: _sum(events, p, nb_start, nb_end, {"kernel"})
                        for p in ("cuda_init", "imports", "dataset_load", "device_move", "mlflow", "own_work",
                                  "cell_open", "cell_close")}
        inside = ((kernel["start"], kernel["start"] + kernel["total"]), (nb_start, nb_end))  # counted there
        worker_mlflow = _sum(events, "mlflow", start, end, {"worker"}, outside=inside)
        worker_imports = _sum(events, "imports", start, end, {"worker"}, outside=inside)
        row = {"cell": cell.get("cell", str(i)), "kernel": "fresh" if fresh else "warm",
               "cell_wall": cell["total"], "notebook_wall": notebook["total"]}
        if i == 0:
            row["process_start_imports"] = start - launched
            row["detail"] = {"runner": (created.get("worker", start) - launched),
                             "worker_process_to_first_cell": start - created.get("worker", start),
                             "runner_imports": _sum(events, "imports", 0, start, {"runner"}),
                             "runner_mlflow": _sum(events, "mlflow", 0, start, {"runner"}),
                             "cuda_init_before_cell": _sum(events, "cuda_init", 0, start, {"runner", "worker"}),
                             "worker_imports_before_cell": _sum(events, "imports", 0, start, {"worker"}),
                             "kernel_imports_in_kernel_start": _sum(events, "imports", kernel["start"],
                                                                    kernel["start"] + kernel["total"], {"kernel"})}
        else:
            row["between_cells"] = start - previous_end
        row["kernel_start" if fresh else "kernel_reuse_prelude"] = kernel["total"]
        row["cuda_init"] = kernel_parts["cuda_init"] + _sum(events, "cuda_init", kernel["start"],
                                                            kernel["start"] + kernel["total"], {"kernel"})
        row["notebook_imports"] = kernel_parts["imports"]
        row["dataset_load_and_move"] = kernel_parts["dataset_load"] + kernel_parts["device_move"]
        row["mlflow"] = kernel_parts["mlflow"] + worker_mlflow
        row["own_work"] = kernel_parts["own_work"]
        row["cell_open_close"] = kernel_parts["cell_open"] + kernel_parts["cell_close"]  # less the parts above
        row["notebook_other"] = notebook["total"] - sum(kernel_parts.values())
        row["worker_other"] = cell["total"] - kernel["total"] - notebook["total"] - worker_mlflow - worker_imports
        if worker_imports:
            row["worker_imports"] = worker_imports
        row["fixed"] = cell["total"] - row["own_work"] + row.get("process_start_imports", 0) + row.get("between_cells", 0)
        rows.append({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
        if "detail" in row:
            rows[-1]["detail"] = {k: round(v, 3) for k, v in row["detail"].items()}
        previous_end = end
    return rows


def summarise(rows: list[dict], wall: float, device: str) -> dict:
    later = rows[1:]
    keys = [k for k in (*PARTS, "cell_wall", "notebook_wall", "fixed") if any(k in r for r in rows)]
    mean_later = {k: round(statistics.mean(r.get(k, 0.0) for r in later), 3) for k in keys
                  if any(k in r for r in later)}  # a part no later cell has (a fresh kernel's start) is left out
    fixed_later = mean_later.get("fixed")
    largest = max(((k, v) for k, v in mean_later.items() if k in PARTS and k != "own_work"), key=lambda kv: kv[1],
                  default=(None, None))
    return {"first_cell": {k: rows[0][k] for k in keys if k in rows[0]}, "later_cells_mean": mean_later,
            "largest_later_part": {"part": largest[0], "seconds": largest[1]},
            "grid_wall_s": round(wall, 3), "target": {"later_cell_fixed_s_below": TARGET_LATER_S, "on": "cuda",
                                                      "later_cell_fixed_s": fixed_later,
                                                      "met": None if fixed_later is None else fixed_later < TARGET_LATER_S,
                                                      "applies": device == "cuda"}}


def store_times(store: Path) -> dict:
    """What the store recorded itself: each cell run's start to end, and its evaluations' train and
    eval seconds (the metrics every evaluation logs), as a check on the probe's numbers."""
    try:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
        ids = [e.experiment_id for e in client.search_experiments()]
        found = client.search_runs(ids, max_results=1000)
    except Exception as exc:  # noqa: BLE001 - a check only
        return {"error": str(exc)[:300]}
    cells, evals = [], []
    for run in found:
        m = run.data.metrics
        if "train_seconds" in m and "ddlib.eval_key" in run.data.tags:
            evals.append(m["train_seconds"] + m.get("eval_seconds", 0.0))
        elif run.info.end_time and run.data.tags.get("ddlib.kernel"):
            cells.append(round((run.info.end_time - run.info.start_time) / 1000, 3))
    return {"cell_run_seconds": sorted(cells), "evaluations": len(evals),
            "train_plus_eval_seconds_total": round(sum(evals), 3)}


def print_table(rows: list[dict], summary: dict) -> None:
    keys = [k for k in (*PARTS, "cell_wall", "fixed") if any(k in r for r in rows)]
    print(f"{'part (s)':24s}" + "".join(f"{'cell ' + str(i + 1):>9s}" for i in range(len(rows))) + f"{'later':>9s}")
    for k in keys:
        later = summary["later_cells_mean"].get(k)
        print(f"{k:24s}" + "".join(f"{r[k]:9.2f}" if k in r else f"{'':9s}" for r in rows)
              + (f"{later:9.2f}" if later is not None else ""))
    t = summary["target"]
    print(f"grid wall {summary['grid_wall_s']:.1f} s; later cells' fixed cost {t['later_cell_fixed_s']} s "
          f"(target < {TARGET_LATER_S} s on the GPU: {'met' if t['met'] else 'not met'}"
          f"{'' if t['applies'] else ', measured here off the GPU'}); largest later part: "
          f"{summary['largest_later_part']['part']} ({summary['largest_later_part']['seconds']} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    parser.add_argument("--cells", type=int, default=4, help="cells of the grid (at least 2)")
    parser.add_argument("--out", help="the JSON (default bench/results/fixed_cost_<device>.json)")
    parser.add_argument("--record", action="store_true", help="also write bench/records/fixed_cost_<device>.json")
    parser.add_argument("--events", help="also copy the probe's raw events (JSON lines) here")
    args = parser.parse_args()
    if args.cells < 2:
        parser.error("--cells: at least 2 (the later cells are what the target is about)")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    from machine import machine_info, write_results  # bench/machine.py, beside this script

    info = machine_info(args.device)
    with tempfile.TemporaryDirectory(prefix="ddlib-fixed-cost-") as tmp:
        events, launched, wall, output = run_grid(Path(tmp), args.device, args.cells)
        if args.events:
            shutil.copy(Path(tmp) / "events.jsonl", args.events)
        stored = store_times(Path(tmp) / "store")
    rows = analyse(events, launched, wall)
    summary = summarise(rows, wall, args.device)
    print_table(rows, summary)
    info["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    result = {"benchmark": "fixed_cost", "date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": args.device,
              "commit": info.get("commit"), "machine": info, "cells": args.cells, "launched": launched,
              "grid": {"protocol": "augmentation", "params": {**PARAMS, "device": args.device},
                       "grid": {"seeds": [[s] for s in range(args.cells)]}, "workers": 1},
              **summary, "per_cell": rows, "store": stored, "runner_output_tail": output[-800:]}
    write_results(result, args.out or ROOT / "bench" / "results" / f"fixed_cost_{args.device}.json")
    if args.record:
        write_results(result, ROOT / "bench" / "records" / f"fixed_cost_{args.device}.json")


if __name__ == "__main__":
    main()
