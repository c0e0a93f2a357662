#!/usr/bin/env python
"""What starting the processes of a grid costs before any training: CPU seconds and wall seconds of
each kind of process ``ddlib run`` and the tests start. Writes bench/results/process_starts.json and
prints a table.

    python bench/process_starts.py            # about 3 minutes on a 2-core CPU
    python bench/process_starts.py --repeats 5

Each row runs its command ``--repeats`` times in a fresh process and reports the median CPU time
(user + system of the process and every child it waited for, from ``getrusage``) and wall time:

* Python alone, then the imports every ``ddlib run`` or pool worker or kernel pays (torch, MLflow,
  papermill with and without ``rfc3987_syntax``, which the pool workers leave out);
* ``ddlib --help`` and ``ddlib run --dry-run`` of a one-cell grid (the runner's own start);
* ``ddlib run`` of one tiny cell (digits, random IPC 1, one seed, 1 epoch: the training is a few
  milliseconds), then of three such cells with one worker, whose kept (warm) kernel runs the second
  and third: the difference over two is what one more warm cell costs, the rest what the runner,
  its pool worker and one kernel cost to start.

Each ``ddlib run`` writes into a fresh scratch store (SQLite), so its cost includes creating one,
as a first grid does. Compare numbers only within one run of this script (CPU model and load in the
JSON).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CELL = {"dataset": "digits", "method": "random", "seeds": [0], "recipe": {"epochs": 1},
        "real_recipe": {"epochs": 1}, "train_per_class": 10, "test_size": 50}
IMPORTS = {
    "python alone": "pass",
    "import torch": "import torch",
    "import mlflow": "import mlflow",
    "import papermill": "import papermill",
    "import papermill, rfc3987_syntax left out (pool workers)": "import sys; sys.modules['rfc3987_syntax'] = None; "
                                                                 "import papermill",
    "import ddlib.run.runner (the runner's imports)": "import ddlib.cli, ddlib.run.runner",
}


def measure(argv: list[str], env, repeats: int, cwd: Path = ROOT) -> dict:
    """Median CPU seconds (the process and its waited-for children) and wall seconds over ``repeats``;
    ``env``: the environment, or a function giving a fresh one for each run."""
    cpu, wall = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        out = subprocess.run(argv, env=env() if callable(env) else env, cwd=cwd, capture_output=True, text=True)
        wall.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if out.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {out.returncode}:\n{(out.stdout + out.stderr)[-3000:]}")
        cpu.append(round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 2))
    return {"cpu_s": round(statistics.median(cpu), 2), "wall_s": round(statistics.median(wall), 2), "cpu_s_all": cpu}


def grid_file(folder: Path, cells: int) -> Path:
    import yaml

    grid = {"protocol": "label_robust", "params": CELL, "grid": {"ipc": list(range(1, cells + 1))}}
    path = folder / f"grid{cells}.yaml"
    path.write_text(yaml.safe_dump(grid, sort_keys=False))
    return path


def run_rows(folder: Path, repeats: int) -> dict:
    base = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1", "DDLIB_NUM_THREADS": "1"}
    rows = {}
    for name, code in IMPORTS.items():
        rows[name] = measure([sys.executable, "-c", code], base, repeats)
        print(f"{name:60s} {rows[name]['cpu_s']:6.2f} CPU-s {rows[name]['wall_s']:6.2f} s", flush=True)

    counter = iter(range(10**6))

    def store_env() -> dict:  # a fresh store for each run: nothing is skipped as finished
        store = folder / f"store{next(counter)}"
        return {**base, "DDLIB_MLRUNS": str(store), "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}"}

    def ddlib(name: str, *args: str) -> None:
        rows[name] = measure([sys.executable, "-m", "ddlib", *args], store_env, repeats)
        print(f"{name:60s} {rows[name]['cpu_s']:6.2f} CPU-s {rows[name]['wall_s']:6.2f} s", flush=True)

    one, three = grid_file(folder, 1), grid_file(folder, 3)
    ddlib("ddlib --help", "--help")
    ddlib("ddlib run --dry-run (one cell)", "run", str(one), "--dry-run")
    ddlib("ddlib run, one tiny cell", "run", str(one), "--workers", "1")
    ddlib("ddlib run, three tiny cells, one worker (warm kernel)", "run", str(three), "--workers", "1")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each row (the median is reported)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "process_starts.json"))
    args = parser.parse_args()
    from machine import machine_info, write_results  # bench/machine.py, beside this script

    info = machine_info("cpu")
    with tempfile.TemporaryDirectory(prefix="ddlib-starts-") as tmp:
        rows = run_rows(Path(tmp), args.repeats)
    one = rows["ddlib run, one tiny cell"]["cpu_s"]
    three = rows["ddlib run, three tiny cells, one worker (warm kernel)"]["cpu_s"]
    derived = {"warm_cell_cpu_s": round((three - one) / 2, 2), "first_cell_start_cpu_s": round(one - (three - one) / 2, 2)}
    print(f"one more cell in a warm kernel: {derived['warm_cell_cpu_s']} CPU-s; the runner, its pool worker and "
          f"the first kernel: {derived['first_cell_start_cpu_s']} CPU-s")
    info["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    write_results({"benchmark": "process_starts", "date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": info,
                   "repeats": args.repeats, "cell": CELL, "rows": rows, "derived": derived}, args.out)


if __name__ == "__main__":
    main()
