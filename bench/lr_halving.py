#!/usr/bin/env python
"""How often ``lr_search: halving`` picks the lr the full search picks (issue 12).

Runs the Label-Robust protocol under DD-Ranking's ``lr_policy: paper`` (every hard-label accuracy
and the random subset searched over the 5-lr grid, scored on the validation split) twice per cell,
``lr_search: full`` then ``halving``, in one scratch MLflow store (halving's full-length runs are the
full search's own, so only its quarter-epoch runs are new), and compares the chosen lr of every
searched side and seed (``syn_hard``, ``rdm_hard``). Two workloads:

* ``digits``: the demo grid (``params/demo.yaml``: Random, K-Center and three DM sets at IPC 1 and
  10, seeds 0-2, its recipe), with the paper policy instead of the demo's ``fixed``;
* ``cifar10``: the DC-distilled CIFAR-10 (JPEG) IPC 10 set (``$DDLIB_SHARED/data``), hard labels,
  ConvNet-3, ``--cifar-epochs`` epochs (default 50), ``--cifar-seeds`` (default 0 1 2), the real pool
  reduced to ``--train-per-class`` images per class (its validation split scores the searches).

Writes ``bench/results/lr_halving.json`` (every pick, agreement counts, trainings and seconds per
mode, machine and load average) and prints a summary. Not part of the test suite.

    .venv/bin/python bench/lr_halving.py                    # both workloads
    .venv/bin/python bench/lr_halving.py --workloads digits # the demo grid only (~5 min on 2 cores)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import write_results  # noqa: E402
SHARED = Path(os.environ.get("DDLIB_SHARED") or ROOT.parent / "shared") / "data"
RESULTS = ROOT / "bench" / "results" / "lr_halving.json"
SEARCHED = ("syn_hard", "rdm_hard")


def _cells_digits(args) -> list[dict]:
    from ddlib.run.grid import expand, load_grid

    spec = load_grid(ROOT / "params" / "demo.yaml")
    spec.params["lr_policy"] = "paper"
    cells = expand(spec)
    return [c for c in cells if (not args.methods or c["method"] in args.methods) and (not args.ipc or c["ipc"] in args.ipc)]


def _cells_cifar(args) -> list[dict]:
    from ddlib.data.loaders import cache_dir, extract_archive

    archive, dc = SHARED / "cifar10-jpeg.tar.gz", SHARED / "distilled" / "dc_cifar10_convnet_ipc10.pt"
    missing = [str(p) for p in (archive, dc) if not p.exists()]
    if missing:
        raise SystemExit(f"cifar10 workload: missing {missing}")
    root = extract_archive(archive, cache_dir() / "cifar10-jpeg")
    return [dict(dataset="cifar10", data_root=str(root), method="dc", ipc=10, model="convnet", seeds=args.cifar_seeds,
                 source={"kind": "file", "path": str(dc)}, train_per_class=args.train_per_class,
                 recipe={"epochs": args.cifar_epochs}, real_recipe={"epochs": 1}, lr_policy="paper")]


def _run_cell(params: dict) -> tuple[dict, float, int]:
    """(role -> {seed: lr}, seconds, trainings) of one label_robust cell."""
    from ddlib.store import tracking
    from ddlib.protocols import label_robust
    from ddlib.store.tags import TAG

    start = time.perf_counter()
    cell = label_robust.open_cell(**params)
    cell.progress = False
    result = label_robust.evaluate(cell, label_robust.obtain(cell))
    cell.close()
    seconds = time.perf_counter() - start
    client = tracking.client()
    trained = client.search_runs([client.get_run(cell.run_id).info.experiment_id],
                                 f"tags.`{TAG['kind']}` = 'eval' and tags.`mlflow.parentRunId` = '{cell.run_id}'",
                                 max_results=10000)
    picks = {}
    for role in SEARCHED:
        if role in result.sides.index:
            lrs = [float(v) for v in str(result.sides.loc[role, "lr"]).split(", ")]
            picks[role] = dict(zip(params["seeds"], lrs))
    return picks, seconds, len(trained)


def workload(name: str, cells: list[dict]) -> dict:
    rows, totals = [], {m: {"seconds": 0.0, "trainings": 0} for m in ("full", "halving")}
    for params in cells:
        picks = {}
        for mode in ("full", "halving"):
            p = {**params, "lr_search": mode}
            picks[mode], seconds, trainings = _run_cell(p)
            totals[mode]["seconds"] += seconds
            totals[mode]["trainings"] += trainings
        for role in picks["full"]:
            for seed, lr in picks["full"][role].items():
                other = picks["halving"][role][seed]
                rows.append({"method": params["method"], "ipc": params["ipc"], "side": role, "seed": seed,
                             "full": lr, "halving": other, "same": lr == other})
                print(f"  {name:<8}{params['method']:<12}ipc {params['ipc']:<3}{role:<10}seed {seed}: "
                      f"full {lr:g}  halving {other:g}{'' if lr == other else '  DIFFERENT'}", flush=True)
    same = sum(r["same"] for r in rows)
    return {"picks": rows, "same": same, "searches": len(rows),
            "agreement": round(same / len(rows), 3) if rows else None, "per_mode": totals,
            "load_average_end": [round(v, 2) for v in os.getloadavg()]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", nargs="+", choices=["digits", "cifar10"], default=["digits", "cifar10"])
    ap.add_argument("--methods", nargs="+", help="digits: only these methods of the demo grid (default: all five)")
    ap.add_argument("--ipc", type=int, nargs="+", help="digits: only these IPCs of the demo grid (default: 1 and 10)")
    ap.add_argument("--cifar-epochs", type=int, default=50)
    ap.add_argument("--cifar-seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--train-per-class", type=int, default=200)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    import torch

    out = {"benchmark": "lr_halving", "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                       "torch_threads": torch.get_num_threads(),
                       "load_average_start": [round(v, 2) for v in os.getloadavg()]},
           "workloads": {}, "args": {k: v for k, v in vars(args).items() if k != "out"}}
    with tempfile.TemporaryDirectory(prefix="ddlib-lr-halving-") as tmp:
        os.environ["DDLIB_MLRUNS"] = str(Path(tmp) / "mlruns")
        for name in args.workloads:
            cells = _cells_digits(args) if name == "digits" else _cells_cifar(args)
            print(f"{name}: {len(cells)} cell(s), full search then halving", flush=True)
            out["workloads"][name] = result = workload(name, cells)
            print(f"{name}: halving picked the full search's lr in {result['same']} of {result['searches']} searches; "
                  f"cells {result['per_mode']}", flush=True)
    out["machine"]["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    write_results(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
