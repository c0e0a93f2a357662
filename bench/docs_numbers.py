"""Regenerate the run numbers the docs quote: ``docs/numbers/demo.md`` (the demo's leaderboard).

    python bench/docs_numbers.py                 # runs params/demo.yaml in a scratch store (minutes)
    python bench/docs_numbers.py --store DIR     # read (and complete) a store that already ran the demo

Runs ``python -m ddlib run params/demo.yaml --workers N`` against a scratch MLflow store, reads the
LRS leaderboard back (``ddlib export --format csv --board lrs``: raw values) and writes the table,
the rank groups and the reference points of the LRS scale, with the machine (CPU model, family,
native bf16, threads, load), the date, the ddlib commit and the wall time. The docs include that file,
so the numbers they quote are those of one run of this script, never typed by hand.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import machine_info  # noqa: E402
from ddlib.scores.metrics import lrs  # noqa: E402

OUT = ROOT / "docs" / "numbers" / "demo.md"
README = ROOT / "README.md"
EXCERPT_BEGIN = "<!-- demo excerpt: written by bench/docs_numbers.py from docs/numbers/demo.md's run -->"
EXCERPT_END = "<!-- end of the demo excerpt -->"


def _env(store: Path) -> dict:
    return {**os.environ, "DDLIB_MLRUNS": str(store), "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}",
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}


def _board(store: Path) -> pd.DataFrame:
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "lrs.csv"
        subprocess.run([sys.executable, "-m", "ddlib", "export", "--format", "csv", "--board", "lrs", "--out", str(csv)],
                       cwd=ROOT, env=_env(store), check=True, capture_output=True, text=True)
        board = pd.read_csv(csv)
    # the CSV is in the shown units (accuracies in %, HLR and IOR in points): back to fractions, as rendered below
    from ddlib.specs import units

    for column in board.columns:
        if column.endswith(units.SUMMARY_SUFFIXES) and pd.api.types.is_numeric_dtype(board[column]):
            board[column] = board[column] / units.unit_of(column).scale
    return board


def _pm(row, key: str, scale: float, digits: int) -> str:
    mean, std = row.get(f"{key}_mean"), row.get(f"{key}_std")
    if mean is None or mean != mean:
        return ""
    return f"{mean * scale:.{digits}f} ± {std * scale:.{digits}f}" if std == std else f"{mean * scale:.{digits}f}"


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def render(board: pd.DataFrame, machine: dict, seconds: float | None, workers: int, params: str) -> str:
    board = board.sort_values(["ipc", "rank", "lrs_mean"], ascending=[True, True, False])
    flags = machine.get("cpu_flags", [])
    cpu = (f"{machine['cpu_model']} (family/model {machine['cpu_family_model']}), {machine['cpu_count']} cores, "
           f"{'native bf16 (avx512_bf16)' if 'avx512_bf16' in flags or 'amx_bf16' in flags else 'no native bf16'}")
    gpu = machine.get("gpu")
    precision = ", ".join(sorted(set(str(p) for p in board.get("precision", pd.Series(dtype=str)).dropna()))) or "?"
    took = ""
    if seconds:
        minutes, rest = divmod(round(seconds), 60)
        took = (f", {minutes} min {rest} s for the grid (load average {machine['load_average_start'][0]} at the start, "
                f"{machine.get('load_average_end', ['?'])[0]} at the end)")
    lines = [
        "<!-- written by bench/docs_numbers.py: do not edit by hand, run the script again -->",
        f"Measured {datetime.date.today().isoformat()} on {cpu}{f', GPU {gpu}' if gpu else ''}; torch {machine['torch']}, "
        f"ddlib commit `{_commit()}`; `{params}` with `--workers {workers}`"
        + took
        + f". Trained in {precision} (`precision: auto` on this CPU). Accuracies in %, HLR and IOR in points, "
          "LRS 0-100; mean ± std over the seeds; `rank` and `tied with`: rows not significantly different share a rank.",
        "",
        "<!-- section: table -->",
        "| ipc | method | seeds | rank | tied with | acc_syn_hard | acc_real_hard | acc_rdm_any | HLR | IOR | LRS |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, row in board.iterrows():
        tied = row.get("tied_with")
        tied = "" if tied is None or tied != tied else str(tied)
        lines.append(f"| {row['ipc']} | {row['method']} | {row.get('seeds', '')} | {row.get('rank', '')} | {tied} | "
                     f"{_pm(row, 'acc_syn_hard', 100, 1)} | {_pm(row, 'acc_real_hard', 100, 1)} | "
                     f"{_pm(row, 'acc_rdm_any', 100, 1)} | {_pm(row, 'hlr', 100, 1)} | {_pm(row, 'ior', 100, 1)} | "
                     f"{_pm(row, 'lrs', 1, 2)} |")
    lines += ["<!-- end section: table -->", "", "<!-- section: ranks -->",
              "Rank groups (the 95 % paired bootstrap over shared seeds; see the results page):", ""]
    for ipc, rows in board.groupby("ipc", sort=True):
        parts = []
        for rank, group in rows.groupby("rank", sort=True):
            names = " and ".join(f"{r['method']} ({r['lrs_mean']:.2f})" for _, r in group.iterrows())
            parts.append(f"rank {rank}: {names}")
        lines.append(f"- IPC {ipc}: " + "; ".join(parts) + ".")
    lines += ["<!-- end section: ranks -->", "", "<!-- section: scale -->",
              "Where these numbers put the LRS scale (w = 0.5; 26.89 is HLR = IOR = 0): a set exactly as good as "
              "the random subsets (IOR 0) trails the full data by their gap, and a set as good as the full data has "
              "HLR 0 and IOR equal to that gap:", ""]
    for ipc, rows in board.groupby("ipc", sort=True):
        real, rdm = rows["acc_real_hard_mean"].mean(), rows["acc_rdm_any_mean"].mean()
        gap = real - rdm
        lines.append(f"- IPC {ipc}: full data {real * 100:.1f} %, random subsets {rdm * 100:.1f} %: IOR 0 scores "
                     f"{lrs(gap, 0.0):.2f} (HLR {gap * 100:.1f} points), a set as good as the full data "
                     f"{lrs(0.0, gap):.2f}.")
    lines.append("<!-- end section: scale -->")
    return "\n".join(lines) + "\n"


def excerpt(board: pd.DataFrame) -> str:
    """The README's few rows: per IPC the first-ranked row and the ``random`` method's."""
    board = board.sort_values(["ipc", "rank", "lrs_mean"], ascending=[True, True, False])
    lines = ["| ipc | method | rank | acc_syn_hard | HLR | IOR | LRS |", "|---|---|---|---|---|---|---|"]
    for _, rows in board.groupby("ipc", sort=True):
        picked = [rows.iloc[0]] + [r for _, r in rows.iloc[1:].iterrows() if r["method"] == "random"]
        for row in picked:
            lines.append(f"| {row['ipc']} | {row['method']} | {row.get('rank', '')} | {_pm(row, 'acc_syn_hard', 100, 1)} | "
                         f"{_pm(row, 'hlr', 100, 1)} | {_pm(row, 'ior', 100, 1)} | {_pm(row, 'lrs', 1, 2)} |")
    return "\n".join(lines)


def update_readme(board: pd.DataFrame, path: Path = README) -> bool:
    """Put the excerpt between the README's markers; False where the README has none."""
    text = path.read_text(encoding="utf-8")
    if EXCERPT_BEGIN not in text or EXCERPT_END not in text:
        return False
    head, rest = text.split(EXCERPT_BEGIN, 1)
    path.write_text(head + EXCERPT_BEGIN + "\n" + excerpt(board) + "\n" + EXCERPT_END + rest.split(EXCERPT_END, 1)[1],
                    encoding="utf-8")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params/demo.yaml")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--store", help="an MLflow folder to use and keep (default: a scratch one, deleted)")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddlib-docs-") as tmp:
        store = Path(args.store) if args.store else Path(tmp) / "mlruns"
        fresh = not (store / "mlflow.db").exists()
        store.mkdir(parents=True, exist_ok=True)
        machine = machine_info()
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "ddlib", "run", args.params, "--workers", str(args.workers)],
                              cwd=ROOT, env=_env(store))
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            print(f"error: ddlib run {args.params} exited {done.returncode}; nothing written", file=sys.stderr)
            return 1
        machine["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
        board = _board(store)
        text = render(board, machine, seconds if fresh else None, args.workers, args.params)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text, encoding="utf-8")
    print(text)
    print(f"wrote {args.out}" + (" and the README's excerpt" if args.out == str(OUT) and update_readme(board) else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
