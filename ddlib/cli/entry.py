"""Command line: ``python -m ddlib run params/demo.yaml``, ``python -m ddlib summary``,
``python -m ddlib report --method dm``, ``python -m ddlib leaderboard --out site/``, ``python -m ddlib ui``,
``python -m ddlib server``; ``python -m ddlib score SET --dataset D``, ``python -m ddlib runs``,
``python -m ddlib export`` (:mod:`ddlib.cli.commands`)."""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import signal
import sys

import pandas as pd

from ddlib.cli.commands import STRICT_HELP, board_options, on_boards
from ddlib.specs.shown import one_line


def _cmd_run(args) -> int:
    from ddlib.run.executors import stop_signal
    from ddlib.run.executors import ExecutorError
    from ddlib.run.grid import GridError
    from ddlib.run.runner import run_grid

    if args.dry_run:  # every cell with its params, what is reused, data and files checked, time estimate
        from ddlib.run.plan import print_plan

        return print_plan(args.params, workers=args.workers or 1, force=args.force)

    try:
        report = run_grid(args.params, workers=args.workers, force=args.force, dry_run=args.dry_run,
                          executor=args.executor, address=args.address, gpus=args.gpus, timeout=args.timeout,
                          strict=args.strict)
    except (GridError, ExecutorError) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:  # Ctrl-C (SIGINT) or SIGTERM (GridInterrupted): one line, naming it
        signum = stop_signal(stop)
        print(f"interrupted ({signal.Signals(signum).name}): running cells marked KILLED; rerun the same command "
              "to finish the grid", file=sys.stderr)
        return 128 + signum
    verb = "would run" if args.dry_run else "finished"
    elsewhere = f", {len(report.elsewhere)} running elsewhere" if report.elsewhere else ""
    reaped = f", {len(report.reaped)} dead run(s) marked KILLED" if report.reaped else ""
    print(f"{verb} {len(report.finished)}, skipped {len(report.skipped)} already finished, "
          f"failed {len(report.failed)}{elsewhere}{reaped} ({report.seconds:.1f} s)")
    for name, flag in report.flags:
        print(f"warning: {name}: {flag}", file=sys.stderr)
    for name, error in report.failed:
        print(f"FAILED {name}: {error}", file=sys.stderr)
    if not report.ok:
        return 1
    if args.summary:  # `make demo`: the summary in this process, whose imports are paid (a second process: 5 s more)
        from ddlib.run.grid import load_grid

        spec = load_grid(args.params)  # a grid filed under its own `experiment:` is summarised from there
        args.summary_args.experiment = spec.experiment if spec.experiment != spec.protocol else None
        args.summary_args.experiment_from = f"{args.params}: experiment"
        return _cmd_summary(args.summary_args)
    return 0


@on_boards
def _cmd_summary(args) -> int:
    from ddlib.report import log_summary
    from ddlib.boards.read import reading_from
    from ddlib.report.sources import cells_elsewhere, elsewhere_note, nothing_on_the_boards
    from ddlib.report.report import build_report, shown

    sections = build_report(w=args.w, gamma=args.gamma, alpha=args.alpha, plots=not args.no_log)  # figures go to the log
    if reading_from():
        print(f"boards of experiment {reading_from()!r} (each protocol's cells in it), not of the protocols' own\n")
    if not sections:
        print(nothing_on_the_boards("nothing to summarise"))
        return 1
    elsewhere = cells_elsewhere()
    tables, figures = {}, {}
    with pd.option_context("display.width", 250, "display.max_columns", 60, "display.max_rows", 500):
        for section in sections:
            print(section.title + (" (mean ± std over seeds)" if any(c.endswith("_mean") for t in section.tables.values()
                                                                    for c in t.columns) else ""))
            if section.caption:
                print(section.caption)
            for name, table in section.tables.items():
                if not table.empty:
                    print(f"[{name}]")
                    print(shown(table).round(3).to_string(index=False))
            if section.figures:
                print(f"plots (PNG, logged with the summary): {', '.join(k for k, f in section.figures.items() if f)}")
            print()
            tables.update({k: v for k, v in section.tables.items() if not v.empty})
            figures.update(section.figures)
    if not args.no_log:
        run_id = log_summary(tables, figures)
        print(f"saved {', '.join(f'{t}.csv' for t in tables)} (+ HTML, PNG) to MLflow run {run_id} (experiment 'summary')")
    if elsewhere:
        print(elsewhere_note(elsewhere))
    print("browse every run: python -m ddlib ui")
    return 0


@on_boards
def _cmd_report(args) -> int:
    from pathlib import Path

    from ddlib.report import card as cards
    from ddlib.report.boards import load_boards

    boards = load_boards(w=args.w, gamma=args.gamma, alpha=args.alpha)
    sets = cards.list_sets(boards, args.method, args.dataset, args.ipc)
    if not sets:
        from ddlib.boards.read import reading_from

        known = sorted({m for m, _, _ in cards.list_sets(boards)})
        where = f" in experiment {reading_from()!r}" if reading_from() else ""
        print(f"error: no finished runs{where} for method {args.method!r}"
              + (f" on {args.dataset}" if args.dataset else "") + (f" at IPC {args.ipc}" if args.ipc is not None else "")
              + f"; methods with runs: {known or 'none (python -m ddlib run params/demo.yaml)'}", file=sys.stderr)
        return 1
    for method, dataset, ipc in sets:
        card = cards.build_card(method, dataset, ipc, boards=boards)
        if args.out is None:
            path = Path(f"report-{card.name}.html")
        elif len(sets) == 1:
            path = Path(args.out)
        else:  # one page per set: FILE-<set>.html
            out = Path(args.out)
            path = out.with_name(f"{out.stem}-{card.name}{out.suffix or '.html'}")
        written, run_id = cards.write_card(card, path, log=not args.no_log)
        missing = [b.protocol for b in card.blocks if not b.ran]
        print(f"{written}: {card.name}" + (f", not run: {', '.join(missing)}" if missing else "")
              + (f" (logged to MLflow run {run_id}, experiment 'report')" if run_id else ""))
    return 0


@on_boards
def _cmd_leaderboard(args) -> int:
    from ddlib.report.site import build_site

    pages = build_site(args.out, w=args.w, gamma=args.gamma, alpha=args.alpha, with_cards=not args.no_cards,
                       progress=True)
    if not pages:
        from ddlib.report.sources import nothing_on_the_boards

        print(nothing_on_the_boards(f"wrote an empty {args.out}/index.html"), file=sys.stderr)
        return 1
    print(f"wrote {len(pages)} leaderboard pages to {args.out}/index.html")
    return 0


def _add_scale_arguments(run) -> None:
    """``run`` options for scale-out and reliability: executor, GPUs, per-cell time limit."""
    run.add_argument("--executor", choices=("local", "ray"), default="local",
                     help="local: a process pool (default); ray: one Ray task per cell (needs a tracking server)")
    run.add_argument("--address", default=None,
                     help="Ray cluster to use (auto, ray://host:10001); default: a local Ray instance for this run")
    run.add_argument("--gpus", default=None,
                     help="local executor: GPU ids (0,1,2,3) or auto; one worker per GPU, each kernel sees only its own")
    run.add_argument("--timeout", type=float, default=None, metavar="S",
                     help="seconds per cell: a notebook over it is stopped and its run FAILED")


def _cmd_server(args) -> int:
    from ddlib.store.server import ServerError, serve

    try:
        return serve(args.backend_store_uri, args.artifacts_destination, host=args.host, port=args.port,
                     workers=args.workers)
    except ServerError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2


def _add_server_parser(sub) -> None:
    server = sub.add_parser("server", help="start an MLflow tracking server that workers on other machines can share")
    server.add_argument("--backend-store-uri", default=os.environ.get("MLFLOW_BACKEND_STORE_URI"),
                        help="database: postgresql://user:password@host:5432/db in production (or set "
                             "MLFLOW_BACKEND_STORE_URI, which keeps the password out of `ps`); default: this "
                             "checkout's SQLite store (mlruns/mlflow.db)")
    server.add_argument("--artifacts-destination", default=None,
                        help="where the server keeps artifacts (a folder or an object store URI); default mlruns/artifacts")
    server.add_argument("--host", default="127.0.0.1",
                        help="interface to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it to the network)")
    server.add_argument("--port", type=int, default=5000, help="port (default 5000)")
    server.add_argument("--workers", type=int, default=None, help="server worker processes (MLflow's default: 4)")
    server.set_defaults(func=_cmd_server)


class _Version(argparse.Action):
    """``ddlib --version``: the version, and the commit where it is known (computed only when asked)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from ddlib.store.provenance import code_version

        print(code_version())
        parser.exit()


def _no_final_collection() -> None:
    """At exit, move every object out of the garbage collector's sight (``gc.freeze``) before the
    interpreter's last collections: they scan the whole imported stack (torch, MLflow, pandas) to free
    memory a dying process returns anyway, 1.6-2.1 s of each command's exit on a 2-core Zen 4 EPYC. Objects
    still go as their references drop, and atexit handlers and finalizers run as before."""
    atexit.unregister(gc.freeze)  # once, however often main() runs in one process (the tests)
    atexit.register(gc.freeze)  # registered early, so it runs after the handlers registered later


def main(argv: list[str] | None = None) -> int:
    """The ``ddlib`` command: parse ``argv`` (default the process's), run the subcommand, return the exit status."""
    parser = argparse.ArgumentParser(prog="ddlib", description=__doc__)
    parser.add_argument("--version", action=_Version, nargs=0, help="print ddlib's version (and git commit) and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="execute a params grid with papermill, tracked in MLflow")
    run.add_argument("params", help="params YAML file, e.g. my_grid.yaml, or a shipped grid by name (demo, cifar10, ...)")
    run.add_argument("--workers", type=int, default=None,
                     help="notebooks executed in parallel (default 1, or one per GPU with --gpus)")
    run.add_argument("--force", action="store_true", help="rerun cells that already have a FINISHED run")
    run.add_argument("--dry-run", action="store_true",
                     help="check params, data and files; list every cell, what it reuses and its time; run nothing")
    run.add_argument("--strict", action="store_true", help=STRICT_HELP)
    run.add_argument("--summary", action="store_true",
                     help="when every cell finished, print and log the summary (as `ddlib summary` would) in this process")
    _add_scale_arguments(run)
    run.set_defaults(func=_cmd_run)
    summ = sub.add_parser("summary", help="print the leaderboard and log it (CSV, HTML, PNG) to MLflow")
    board_options(summ)
    summ.add_argument("--no-log", action="store_true", help="print only; do not create a summary run")
    summ.set_defaults(func=_cmd_summary)
    rep = sub.add_parser("report", help="write a set's report card (one HTML page) and log it to MLflow")
    rep.add_argument("--method", required=True, help="the method whose set is reported, e.g. dm")
    rep.add_argument("--dataset", help="its dataset (needed where the method ran on several)")
    rep.add_argument("--ipc", type=int, help="its images per class (needed where it ran at several)")
    rep.add_argument("--out", help="HTML file (default report-<method>-ipc<ipc>-<dataset>.html); with several "
                                   "sets, one FILE-<set>.html each")
    board_options(rep)
    rep.add_argument("--no-log", action="store_true", help="write the file only; do not create a report run")
    rep.set_defaults(func=_cmd_report)
    board = sub.add_parser("leaderboard", help="generate the static leaderboard site from MLflow")
    board.add_argument("--out", default="site", help="output folder (default site/)")
    board.add_argument("--no-cards", action="store_true", help="leave out the report card of every set")
    board_options(board)
    board.set_defaults(func=_cmd_leaderboard)
    from ddlib.cli.commands import register

    register(sub)  # score, runs, export, ui
    _add_server_parser(sub)
    args = parser.parse_args(argv)
    _no_final_collection()
    if args.command == "run":
        args.summary_args = summ.parse_args([])  # `run --summary`: the summary with its own defaults
    if args.command not in ("server", "ui"):  # every other command reads or writes the store
        from ddlib.store.errors import unreachable_server

        if why := unreachable_server():
            print(f"error: {why}", file=sys.stderr)
            return 2
    from ddlib.protocols.spec import ProtocolLoadError
    from ddlib.store.errors import StoreError

    try:
        return args.func(args)
    except (ProtocolLoadError, StoreError) as e:  # a protocol that cannot be imported; a store that cannot be made
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:  # `ddlib score` and the rest: one line, not a traceback
        from ddlib.run.executors import stop_signal

        signum = stop_signal(stop)
        print(f"interrupted ({signal.Signals(signum).name})", file=sys.stderr)
        return 128 + signum


if __name__ == "__main__":
    sys.exit(main())
