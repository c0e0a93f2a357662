"""Command line: ``python -m ddlib run params/demo.yaml``, ``python -m ddlib summary``, ``python -m ddlib ui``."""

from __future__ import annotations

import argparse
import shlex
import sys

import pandas as pd


def _cmd_run(args) -> int:
    from ddlib.runner import GridError, run_grid

    try:
        report = run_grid(args.params, workers=args.workers, force=args.force, dry_run=args.dry_run)
    except GridError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    verb = "would run" if args.dry_run else "finished"
    print(f"{verb} {len(report.finished)}, skipped {len(report.skipped)} already finished, "
          f"failed {len(report.failed)} ({report.seconds:.1f} s)")
    for name, error in report.failed:
        print(f"FAILED {name}: {error}", file=sys.stderr)
    return 0 if report.ok else 1


def _cmd_summary(args) -> int:
    from ddlib.report import log_summary
    from ddlib.report.report import build_report, shown

    sections = build_report(w=args.w, gamma=args.gamma, alpha=args.alpha)
    if not sections:
        print("no finished runs yet: run `python -m ddlib run params/demo.yaml`")
        return 1
    tables, figures = {}, {}
    with pd.option_context("display.width", 250, "display.max_columns", 60, "display.max_rows", 500):
        for section in sections:
            print(f"{section.title} (mean ± std over seeds)")
            for name, table in section.tables.items():
                if not table.empty:
                    print(f"[{name}]")
                    print(shown(table).round(3).to_string(index=False))
            print()
            tables.update({k: v for k, v in section.tables.items() if not v.empty})
            figures.update(section.figures)
    if not args.no_log:
        run_id = log_summary(tables, figures)
        print(f"saved {', '.join(f'{t}.csv' for t in tables)} (+ HTML, PNG) to MLflow run {run_id} (experiment 'summary')")
    print(f"browse every run: {ui_command()}")
    return 0


def ui_command() -> str:
    from ddlib.tracking import tracking_uri

    return f"mlflow ui --backend-store-uri {shlex.quote(tracking_uri())} --port 5000"


def _cmd_ui(args) -> int:
    print(ui_command())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddlib", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="execute a params grid with papermill, tracked in MLflow")
    run.add_argument("params", help="params YAML file, e.g. params/demo.yaml")
    run.add_argument("--workers", type=int, default=1, help="notebooks executed in parallel (default 1)")
    run.add_argument("--force", action="store_true", help="rerun cells that already have a FINISHED run")
    run.add_argument("--dry-run", action="store_true", help="validate and list what would run")
    run.set_defaults(func=_cmd_run)
    summ = sub.add_parser("summary", help="print the leaderboard and log it (CSV, HTML, PNG) to MLflow")
    summ.add_argument("--w", type=float, default=0.5, help="LRS weight on IOR (default 0.5)")
    summ.add_argument("--gamma", type=float, default=0.5, help="ARS weight on IOR with augmentation (default 0.5)")
    summ.add_argument("--alpha", type=float, default=0.5, help="BEARD's CREI weight on RR (default 0.5)")
    summ.add_argument("--no-log", action="store_true", help="print only; do not create a summary run")
    summ.set_defaults(func=_cmd_summary)
    ui = sub.add_parser("ui", help="print the command that opens the MLflow UI on this store")
    ui.set_defaults(func=_cmd_ui)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
