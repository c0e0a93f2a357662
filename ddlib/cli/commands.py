"""The newcomer's commands: ``ddlib score`` (one set, no YAML), ``ddlib runs`` (cell runs and their
status), ``ddlib export`` (leaderboards as CSV / Markdown / LaTeX with the recipe columns) and
``ddlib ui`` (MLflow's UI on this store, started on 127.0.0.1). :func:`register` adds them to the
command line of :mod:`ddlib.cli`."""

from __future__ import annotations

import argparse
import shlex
import sys

import pandas as pd

from ddlib.report.ui import UI_HOST, UI_PORT  # `ddlib ui`'s address, where the run links point
from ddlib.specs.shown import one_line, shown
from ddlib.scores.tables import FORMATS

__all__ = ["register", "UI_HOST", "UI_PORT", "ui_argv"]

STRICT_HELP = ("refuse a set that holds test images (exact or near-duplicates): its cell FAILS before training "
               "(default: scored and flagged; also DDLIB_STRICT=1)")


# --------------------------------------------------------------------------- score


def _utf8(option: str, text: str, what: str = "the value") -> None:
    """Refuse an option whose text holds bytes that are not UTF-8 (the shell passes any bytes; the params
    file ``ddlib score`` writes, and MLflow, take UTF-8 text only), before anything is written."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{option}: {what} holds bytes that are not UTF-8") from None


def _value(key: str, text: str):
    """``--param key=value``: the value as YAML reads it (numbers, lists, mappings, null), with the
    checks a params file gets (:func:`ddlib.specs.yamlfile.parse_yaml`: no alias bomb, no recursive alias,
    no control character, no key twice); a ValueError naming the option and the key otherwise."""
    from ddlib.specs.yamlfile import parse_yaml

    _utf8(f"--param {key}", text)
    return parse_yaml(text, f"--param {key}")


def _score_params(args) -> dict:
    """The protocol parameters ``ddlib score``'s options give; a ValueError naming the option first
    (a name or path that is not UTF-8 included: nothing is written before they are checked)."""
    for option in ("method", "dataset", "preset", "data_root", "like"):
        if getattr(args, option) is not None:
            _utf8(f"--{option.replace('_', '-')}", str(getattr(args, option)))
    if args.method is not None and (not args.method.strip() or "/" in args.method):
        raise ValueError(f"--method: a name for the leaderboards (it also names the params file), without /, "
                         f"got {shown(args.method)}")
    params = {}
    for item in args.param or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--param takes key=value, got {shown(item)}")
        _utf8("--param", key, "the key")
        params[key.strip()] = _value(key.strip(), value)
    if args.seeds is not None:
        params["seeds"] = args.seeds
    if args.preset is not None:
        params["preset"] = args.preset
    if args.data_root is not None:
        params["data_root"] = args.data_root
    if args.epochs is not None:
        params["epochs"] = args.epochs
    return params


def _written_grid(grid: dict) -> dict:
    """The grid with its path-valued parameters absolute (:func:`ddlib.run.grid.absolute_paths`), so the
    params file ``ddlib score`` writes reruns from any folder ("rerun with")."""
    from ddlib.protocols.spec import get_spec
    from ddlib.run.grid import absolute_paths

    return {**grid, "params": absolute_paths(grid["params"], get_spec(grid["protocol"]).path_params)}


def _cmd_score(args) -> int:
    from ddlib.run.grid import GridError
    from ddlib.run.runner import run_grid
    from ddlib.scoring import FILE_OPTIONS, cell_result, given_file_options, resolve_cell, score_grid, write_grid

    options = given_file_options(**{k: getattr(args, k) for k in FILE_OPTIONS})
    try:
        grid = score_grid(args.set, args.dataset, args.protocol, method=args.method, ipc=args.ipc,
                          file_options=options, dry_run=args.dry_run, like=args.like, quick=args.quick,
                          **_score_params(args))
        grid = _written_grid(grid)
        from ddlib.store.errors import check_store_writable

        check_store_writable()  # the params file goes into the store: a StoreError is one line, not a traceback
    except ValueError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    path = write_grid(grid)
    note = sys.stderr if getattr(args, "format", "table") in ("csv", "json") else sys.stdout  # stdout: the numbers only
    print(f"params file: {path}", file=note)
    if args.quick:
        from ddlib.scoring import quick_note

        print(quick_note(grid["protocol"]), file=note)
    if args.dry_run:
        from ddlib.run.plan import print_plan

        return print_plan(path)
    try:
        report = run_grid(path, workers=1, force=args.force, progress=not args.quiet, strict=args.strict)
        protocol, experiment, cell = resolve_cell(grid)
    except GridError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    for name, error in report.failed:
        print(f"FAILED {name}: {error}", file=sys.stderr)
    if not report.ok:
        return 1
    result = cell_result(protocol, experiment, cell)
    if result is None:
        print("error: the cell finished but its run is not in the store", file=sys.stderr)
        return 1
    if args.quick:
        from ddlib.scoring import tag_quick

        tag_quick(result.run_id, protocol)
    verb = "reused the finished cell" if report.skipped else "scored"
    preset = f", preset {cell['preset']}" if cell.get("preset") is not None else ""  # the one a protocol picks, too
    seeds = len(result.per_seed)
    print(f"{verb} {result.name} on {result.data or cell['dataset']} ({protocol}{preset}, {seeds} "
          f"seed{'s' if seeds != 1 else ''}); MLflow run: {run_link(experiment, result.run_id)}", file=note)
    _print_values(result, args.columns, args.format, note)
    _print_flags(result)
    return 0


def run_link(experiment: str, run_id: str) -> str:
    """The run's page in MLflow's UI as ``ddlib ui`` serves it (a tracking server's own address where
    the store is one)."""
    from ddlib.report.ui import cell_link
    from ddlib.store.tracking import client

    found = client().get_experiment_by_name(experiment)
    return cell_link(found.experiment_id, run_id) if found is not None else run_id


def _print_values(result, columns: str, fmt: str, note) -> None:
    """The result's values in their units (:mod:`ddlib.scores.tables`): the scores, or every value."""
    from ddlib.scores.tables import render

    table = result.values(columns)
    print(render(table, fmt))
    if fmt in ("csv", "json"):
        return
    rest = len([c for c in result.per_seed.columns if c != "seed"]) - len(table)
    if rest > 0:
        print(f"({rest} more values: --columns all; as CSV or JSON: --format csv|json)", file=note)
    facts = result.facts
    if "models_trained" in facts:
        print(f"models: {facts['models_trained']:.0f} trained, {facts.get('models_reused', 0):.0f} reused from "
              "the store", file=note)


def _print_flags(result) -> None:
    """The cell's ``ddlib.sanity`` flags (near-chance accuracies, a suspicious checkpoint), whether
    the cell ran now or was reused."""
    from ddlib.protocols.cell import SANITY_TAG
    from ddlib.store.tracking import client

    try:
        flag = client().get_run(result.run_id).data.tags.get(SANITY_TAG)
    except Exception:  # noqa: BLE001 - the flag is advice; the result stands
        return
    if flag:
        print(f"warning: {flag}", file=sys.stderr)


def _add_score_parser(sub) -> None:
    from ddlib.scoring import SET_PROTOCOLS

    score = sub.add_parser("score", help="score one distilled set (.pt, .npz, MTT folder, ImageFolder) without YAML")
    score.add_argument("set", help="the set: a file or folder ddlib.data.distilled.load reads")
    score.add_argument("--dataset", help="the real dataset it was distilled from (digits, cifar10, ...); with --like, "
                                         "the grid's")
    score.add_argument("--protocol", choices=SET_PROTOCOLS, help="default label_robust (LRS); with --like, the grid's")
    score.add_argument("--like", metavar="GRID.yaml",
                       help="score the set in an existing grid's setting (its protocol, experiment, recipe, seeds, "
                            "reference epochs), so its row sits beside the grid's rows; a file, or a shipped grid's "
                            "name (cifar10)")
    score.add_argument("--preset", help="the method's evaluation preset (params/methods/<name>.yaml or a path)")
    score.add_argument("--seeds", type=int, nargs="+", help="evaluation seeds (default: the protocol's, 5)")
    score.add_argument("--epochs", type=int, help="what the set is trained for (a preset's preset_epochs, else the "
                                                  "recipe's epochs; default: the protocol's)")
    score.add_argument("--columns", choices=("scores", "all"), default="scores",
                       help="scores: the protocol's scores and the accuracies they come from (default); all: every value")
    score.add_argument("--format", choices=FORMATS, default="table",
                       help="table (default), markdown, or the numbers (in their units) as csv or json on stdout")
    score.add_argument("--method", help="the name the set gets in leaderboards (default: the file's name)")
    score.add_argument("--ipc", type=int, help="images per class (default: read from the set)")
    score.add_argument("--data-root", help="where the dataset is (else DDLIB_DATA)")
    score.add_argument("--param", action="append", metavar="KEY=VALUE",
                       help="any other protocol parameter, as YAML: --param lr_policy=fixed --param 'real_recipe={epochs: 5}'")
    score.add_argument("--normalized", action=argparse.BooleanOptionalAction, default=None,
                       help="the file's images are normalised with the dataset's mean/std (--no-normalized: they are "
                            "pixels; default: the format's, DC and MTT files normalised, others pixels)")
    score.add_argument("--allow-unequal", action="store_true", help="accept unequal images per class")
    score.add_argument("--experiment-index", type=int, help="which experiment of a DC-format file (default: the last)")
    score.add_argument("--zca-space", action=argparse.BooleanOptionalAction, default=None,
                       help="the images are ZCA-whitened (MTT --zca; --no-zca-space overrides the file's own flag)")
    score.add_argument("--trusted", action="store_true",
                       help="a .pt file the safe loader refuses may be fully unpickled (runs code: only files you trust)")
    score.add_argument("--force", action="store_true", help="score again even if this cell already finished")
    score.add_argument("--dry-run", action="store_true", help="check the set and list the cell; run nothing")
    score.add_argument("--quick", action="store_true", help="a first look in a minute or two (one seed, few epochs, "
                                                            "a small lr grid: ddlib.scoring.QUICK), not a result")
    score.add_argument("--quiet", action="store_true", help="no progress bar")
    score.add_argument("--strict", action="store_true", help=STRICT_HELP)
    score.set_defaults(func=_cmd_score)


# --------------------------------------------------------------------------- runs, export


def _cmd_runs(args) -> int:
    from ddlib.report.runs import list_cell_runs  # not report.export: no torch, no SciPy

    table = list_cell_runs(args.status, args.experiment, links=args.links)
    if table.empty:
        print("no cell runs" + (f" with status {args.status}" if args.status else "")
              + " (python -m ddlib run params/demo.yaml)")
        return 0
    shown = table if args.ids else table.drop(columns="run_id")
    width = max(80, int(table["link"].str.len().max())) if args.links else 80  # a link is shown whole
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.max_colwidth", width):
        print(shown.to_string(index=False))
    counts = table["status"].value_counts().to_dict()
    print(f"{len(table)} cell runs: " + ", ".join(f"{n} {s.lower()}" for s, n in counts.items()))
    return 0


def on_boards(command):
    """``command`` with its boards read from ``--experiment`` (each protocol's cells there) or from each
    protocol's own experiment; an experiment without finished cells is a one-line error (exit 2),
    checked before anything else. ``args.experiment_from``: where the name came from, for that line
    (``--experiment``, or the grid's ``experiment:`` key for ``ddlib run --summary``)."""
    def run(args) -> int:
        from ddlib.report.sources import boards_from, unknown_experiment

        if args.experiment is not None and (why := unknown_experiment(args.experiment)):
            print(f"error: {getattr(args, 'experiment_from', '--experiment')}: {why}", file=sys.stderr)
            return 2
        with boards_from(args.experiment, check=False):
            return command(args)

    run.__doc__ = command.__doc__
    return run


def board_options(parser) -> None:
    """What every command that reads the boards takes: the score weights and the experiment."""
    parser.add_argument("--w", type=float, default=0.5, help="LRS weight on IOR (default 0.5)")
    parser.add_argument("--gamma", type=float, default=0.5, help="ARS weight on IOR with augmentation (default 0.5)")
    parser.add_argument("--alpha", type=float, default=0.5, help="BEARD's CREI weight on RR (default 0.5)")
    parser.add_argument("--experiment", metavar="NAME",
                        help="read the boards from this MLflow experiment (where a grid's `experiment:` key filed its "
                             "cells), each protocol's cells in it; default: each protocol's own experiment")


@on_boards
def _cmd_export(args) -> int:
    from ddlib.report.boards import load_boards
    from ddlib.report.export import export_tables, write_export

    if (args.out is None) == (args.bundle is None):
        print("error: export needs --out FILE (leaderboards) or --bundle DIR (a leaderboard submission), one of them",
              file=sys.stderr)
        return 2
    try:
        boards = load_boards(w=args.w, gamma=args.gamma, alpha=args.alpha)
        if args.bundle is not None:
            from ddlib.report.bundle import write_bundle

            try:
                paths = write_bundle(args.bundle, boards, w=args.w, gamma=args.gamma, methods=args.method)
            except OSError as e:
                print(f"error: {_unwritable('--bundle', args.bundle, e)}", file=sys.stderr)
                return 1
            if not paths:
                from ddlib.report.sources import nothing_on_the_boards

                print(nothing_on_the_boards("nothing to bundle"), file=sys.stderr)
                return 1
            print(f"wrote {', '.join(str(p) for p in paths.values())}")
            return 0
        tables = export_tables(boards, args.board, formatted=args.format != "csv")
    except ValueError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    if not tables:
        from ddlib.report.sources import nothing_on_the_boards

        print(nothing_on_the_boards("nothing to export"), file=sys.stderr)
        return 1
    try:
        path = write_export(args.out, args.format, tables)
    except OSError as e:  # a full disk (/dev/full), a read-only or missing place, a file where a folder should be
        print(f"error: {_unwritable('--out', args.out, e)}", file=sys.stderr)
        return 1
    print(f"wrote {', '.join(f'{n} ({len(t)} rows)' for n, t in tables.items())} to {path}")
    return 0


def _unwritable(option: str, path, error: OSError) -> str:
    """One line naming where an output option could not be written, and why (the OS's words)."""
    import os

    part = os.fsdecode(error.filename) if error.filename is not None else str(path)
    if isinstance(error, (FileExistsError, NotADirectoryError)):  # mkdir of a parent that is a file
        why = f"{part} is a file, not a folder" if isinstance(error, FileExistsError) else "a folder on its way is a file"
    else:
        why = f"{error.strerror or error}" + (f" ({part})" if part != str(path) else "")
    return f"cannot write {option} {path}: {why}"


def _cmd_import(args) -> int:
    from ddlib.report.bundle import PUBLISHED_EXPERIMENT, import_published

    try:
        added, skipped = import_published(args.file, reference=args.reference)
    except ValueError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    print(f"imported {added} published row(s) from {args.file} into experiment '{PUBLISHED_EXPERIMENT}'"
          + (f" ({skipped} already there)" if skipped else "")
          + "; `ddlib summary` and `ddlib export` show them apart, labelled published")
    return 0


EXPORT_FORMATS = ("csv", "markdown", "latex")  # = ddlib.report.export.FORMATS (tested), without its imports


def _add_runs_export_parsers(sub) -> None:
    runs = sub.add_parser("runs", help="list the cell runs of the store (status, error, run id)")
    runs.add_argument("--status", type=str.lower, choices=("finished", "failed", "running", "killed"))
    runs.add_argument("--experiment", help="only this experiment (e.g. label_robust)")
    runs.add_argument("--ids", action="store_true", help="show the MLflow run ids")
    runs.add_argument("--links", action="store_true", help="show each run's page in MLflow's UI (as `ddlib ui` serves it)")
    runs.set_defaults(func=_cmd_runs)
    export = sub.add_parser("export", help="write the leaderboards (with recipe, epochs, data source, code version)")
    export.add_argument("--format", choices=EXPORT_FORMATS, default="csv")
    export.add_argument("--out", help="the file to write")
    export.add_argument("--bundle", metavar="DIR", help="write a leaderboard submission instead: bundle.json (per set: "
                        "digest, config, per-seed results, code version, data label), ddranking.csv (DD-Ranking's "
                        "leaderboard columns) and leaderboards.csv")
    export.add_argument("--board", action="append", help="only this leaderboard (lrs, ars, beard, augmentation, ...)")
    export.add_argument("--method", action="append", metavar="METHOD",
                        help="with --bundle: only this set's rows (repeat for several; default: every set in the store)")
    board_options(export)
    export.set_defaults(func=_cmd_export)
    imp = sub.add_parser("import", help="read published leaderboard rows (DD-Ranking's columns, as in ddranking.csv) "
                                        "for comparison; stored apart and shown labelled published")
    imp.add_argument("file", help="CSV with method, dataset, ipc and DD-Ranking's score columns")
    imp.add_argument("--reference", help="where the rows were published (default: the file's source column or name)")
    imp.set_defaults(func=_cmd_import)


# --------------------------------------------------------------------------- ui


def ui_argv(port: int = UI_PORT, host: str = UI_HOST) -> list[str]:
    """MLflow's UI on this store, with this interpreter (no activated venv needed)."""
    from ddlib.store.paths import tracking_uri

    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking_uri(), "--host", host,
            "--port", str(port)]


def _cmd_ui(args) -> int:
    from ddlib.report.ui import ui_urls
    from ddlib.store.server import JOB_EXECUTION_ENV, ServerError, check_port_free, mlflow_server_env, run_foreground
    from ddlib.store.errors import StoreError, check_store_writable
    from ddlib.store.tracking import init_store

    argv, env = ui_argv(args.port), mlflow_server_env()
    if args.print:
        print(shlex.join(["env", f"{JOB_EXECUTION_ENV}={env[JOB_EXECUTION_ENV]}", *argv]))  # as it would start
        return 0
    try:  # a taken port, a store that cannot be written: one line, before MLflow prints a traceback
        check_port_free(UI_HOST, args.port)
        check_store_writable()
    except (ServerError, StoreError) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    init_store()
    base = f"http://{UI_HOST}:{args.port}"
    pages = "".join(f"runs of {name}: {url}\n" for name, url in ui_urls(base).items())
    print(f"starting MLflow's UI on {base} ...", flush=True)
    try:
        return run_foreground(argv, env, base, f"{pages}MLflow UI on {base} (Ctrl-C stops it)")
    except ServerError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 1


def _add_ui_parser(sub) -> None:
    ui = sub.add_parser("ui", help=f"start MLflow's UI on this store at http://{UI_HOST}:{UI_PORT} (and print the runs pages)")
    ui.add_argument("--port", type=int, default=UI_PORT)
    ui.add_argument("--print", action="store_true", help="only print the command that starts it")
    ui.set_defaults(func=_cmd_ui)


def register(sub) -> None:
    """Add score, runs, export, import and ui to the ``ddlib`` command line."""
    _add_score_parser(sub)
    _add_runs_export_parsers(sub)
    _add_ui_parser(sub)
