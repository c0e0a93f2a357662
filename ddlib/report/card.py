"""The report card: everything ddlib knows about one distilled set (method x dataset x IPC) on one
self-contained HTML page, also logged to MLflow (experiment ``report``, one run per card).

Every number comes from the leaderboard functions of :mod:`ddlib.report` (so the card shows what
the leaderboards show, with their definitions and weights), each as its mean over seeds with the
bootstrap interval those functions compute (:data:`ddlib.boards.rank.INTERVALS`), the number of
seeds, and the set's rank among the methods it was compared with. A protocol with no finished cell
for the set says "not run" and gives the command that would run it. Loss curves and the confusion
matrix come from the evaluations the label-robust cell trained (:mod:`ddlib.report.evals`).
"""

from __future__ import annotations

import datetime
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ddlib.protocols.spec import all_specs
from ddlib.protocols.common import FULL_IPC
from ddlib.boards.rank import INTERVALS, rank_caption
from ddlib.boards.read import param, reading_from, source_tags
from ddlib.boards.table import display_format
from ddlib.protocols.beard_boards import eps_curve_figures, plot_eps_curves
from ddlib.report import evals, viz
from ddlib.report.boards import Boards, load_boards
from ddlib.report.export import row_recipe
from ddlib.report.plots import board_rows, ipc_points, radar_families, radar_profile, set_grid_png
from ddlib.report.rerun import data_label, run_command
from ddlib.report.html import escape, figure_png, image_tag, page, table_html
from ddlib.scores.stats import describe_method
from ddlib.store.provenance import default_tags
from ddlib.store.tags import TAG
from ddlib.store.tracking import Tracker, client

__all__ = ["list_sets", "Block", "Card", "build_card", "render_html", "log_card",
           "write_card", "data_label", "run_command", "format_value"]


def _layout() -> list[tuple]:
    """Per protocol (from its spec's headline board): (protocol, board, title, value columns as (column,
    label) with None for every other value column, the columns that tell this set's rows apart, the
    board's score and its label). The score is the one the board ranks by: the card headlines it."""
    out = []
    for spec in all_specs():
        board = spec.board()
        values = [*board.columns, *([None] if board.more_columns else [])]
        out.append((spec.name, board.name, board.title, values, board.variant, board.score, board.label))
    return out


def list_sets(boards: Boards, method: str | None = None, dataset: str | None = None,
              ipc: int | None = None) -> list[tuple[str, str, int]]:
    """The (method, dataset, ipc) sets with at least one finished cell, in a stable order."""
    found = set()
    for spec in all_specs():
        board = boards[spec.headline]
        if board.empty:
            continue
        for m, d, i in zip(board["method"].astype(str), board["dataset"].astype(str), board["ipc"]):
            if (method is None or m == method) and (dataset is None or d == dataset) and (ipc is None or i == ipc):
                found.add((m, d, int(i)))
    return sorted(found, key=lambda s: (s[1], s[0], s[2]))


# --------------------------------------------------------------------------- formatting


def format_value(base: str, mean: float, low: float, high: float) -> str:
    """A mean and its interval in the unit the leaderboards show (percent, 0-100, seconds)."""
    scale, fmt = display_format(base)
    if pd.isna(mean):
        return "n/a"
    if pd.isna(low):
        return f"{fmt.format(mean * scale)} (no interval)"
    return f"{fmt.format(mean * scale)} [{fmt.format(low * scale)}, {fmt.format(high * scale)}]"


def _variant(row: pd.Series, keys) -> str:
    parts = []
    for key in keys:
        if key not in row:
            continue
        value = row[key]
        if value is None or (isinstance(value, float) and pd.isna(value)):
            value = "none"
        parts.append(f"{key} {value}")
    for key in ("precision", "set"):  # in every row key (ddlib.boards.read)
        if isinstance(row.get(key), str):
            parts.append(f"{key} {row[key] if key == 'precision' else row[key][:8]}")
    if "config" in row and isinstance(row.get("config"), str):
        parts.append(f"config {row['config']}")
    return ", ".join(parts) or "as run"


def _compared(board: pd.DataFrame, row: pd.Series) -> int:
    """How many rows this row was ranked among (one family at one IPC)."""
    keep = pd.Series(True, index=board.index)
    for key in ("family", "ipc"):
        if key in board:
            keep &= board[key] == row[key]
    return int(keep.sum())


def score_table(board: pd.DataFrame, rows: pd.DataFrame, values, keys, score: str | None,
                recipes: dict | None = None) -> pd.DataFrame:
    """One column per row of the set (e.g. targeted / untargeted), one line per value: mean and
    interval in display units, then the row's recipe and epochs (``recipes``: runs -> :func:`row_recipe`),
    seeds and the rank among the methods compared."""
    columns = {}
    wanted = []
    for item in values:
        if item is None:  # every other value the board has
            listed = {v[0] for v in values if v}
            wanted += [(b, b) for b in (c[:-len("_mean")] for c in board.columns if c.endswith("_mean"))
                       if b not in listed and not rows[f"{b}_mean"].isna().all()]
        elif f"{item[0]}_mean" in board:
            wanted.append(item)
    for _, row in rows.iterrows():
        column = {label: format_value(base, row[f"{base}_mean"], row.get(f"{base}_low"), row.get(f"{base}_high"))
                  for base, label in wanted}
        made = (recipes or {}).get(str(row.get("runs", "")))
        if made:
            column["recipe"], column["epochs"] = made["recipe"], made["epochs"]
        column["seeds"] = str(row["seeds"])
        if score and "rank" in row and not pd.isna(row["rank"]):
            tied = row.get("tied_with") or "none"
            column[f"rank on {score.upper()}"] = f"{int(row['rank'])} of {_compared(board, row)} (tied with: {tied})"
        elif score and isinstance(row.get("unranked"), str) and row["unranked"]:  # a set holding test images
            column[f"rank on {score.upper()}"] = row["unranked"]
        if isinstance(row.get("sanity"), str) and row["sanity"]:  # near chance, test images in the set
            column["sanity"] = row["sanity"]
        columns[_variant(row, keys)] = column
    return pd.DataFrame(columns)


def _as_surrogate(board: pd.DataFrame, method: str, dataset: str, ipc: int) -> tuple[Block, dict] | None:
    """The black-box block of a set whose models were a surrogate (the attacks were crafted on them) but
    never a target: each target's accuracy under the attacks crafted on this set, and the headline's
    line (their mean over targets and attacks). None where the set was no surrogate either."""
    column = f"from.{method}"
    if board.empty or f"{column}_mean" not in board:
        return None
    rows = board[(board["dataset"].astype(str) == dataset) & (board["ipc"] == ipc) & board[f"{column}_mean"].notna()
                 & (board["method"].astype(str) != method)]
    if rows.empty:
        return None
    table = pd.DataFrame({f"{row['method']} ({row['attack']})": {
        "target's accuracy under the attacks crafted on this set": format_value(
            column, row[f"{column}_mean"], row.get(f"{column}_low"), row.get(f"{column}_high")),
        "target's clean accuracy": format_value("clean_acc", row.get("clean_acc_mean"), row.get("clean_acc_low"),
                                                row.get("clean_acc_high")),
        "seeds": str(row["seeds"])} for _, row in rows.iterrows()})
    runs = _runs(rows)
    block = Block("blackbox", "BEARD black-box: this set as the surrogate", True, runs=runs,
                  tables=[("Mean over seeds [95 % interval]: how well attacks crafted on models trained on this set "
                           "transfer (lower: a stronger surrogate). The targets' own rows are on the black-box "
                           "board.", table)])
    mean = float(rows[f"{column}_mean"].mean())
    line = {"score": "targets' accuracy under its attacks", "value": format_value(column, mean, float("nan"),
                                                                                 float("nan")),
            "seeds": str(int(rows["seeds"].min())), "rank": "", "recipe": "", "epochs": ""}
    return block, line


# --------------------------------------------------------------------------- the card


@dataclass
class Block:
    """One protocol's part of a report card: whether it ran for this set, its rows, figures and rerun command."""

    protocol: str
    title: str
    ran: bool
    command: str = ""  # what would run it (when it has not run)
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)  # (caption, table)
    runs: list[str] = field(default_factory=list)  # the MLflow cell runs its numbers pool
    config: dict | None = None  # the resolved params of its first cell


@dataclass
class Card:
    """The report card of one set (method, dataset, IPC): a block per protocol, from the specs."""

    method: str
    dataset: str
    ipc: int
    data: str  # "CIFAR-10 (JPEG)", "digits"
    data_source: str  # where the real data was read from
    blocks: list[Block]
    headline: pd.DataFrame  # each protocol's score, or "not run"
    figures: dict = field(default_factory=dict)  # name -> matplotlib figure (or None)
    image_grid: bytes | None = None  # the set's images labelled with their classes (a PNG)
    image_note: str = ""  # what the grid shows
    seed_counts: list = field(default_factory=list)  # the seeds of every row on the card (its caveats)
    settings: dict = field(default_factory=dict)
    created: str = ""

    @property
    def name(self) -> str:
        ipc = "full" if self.ipc == FULL_IPC else f"ipc{self.ipc}"
        return f"{self.method}-{ipc}-{self.dataset}"


def _runs(rows: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(r for text in rows.get("runs", pd.Series(dtype=str)).fillna("") for r in text.split()))


def _cell_info(run_ids: list[str]) -> tuple[dict | None, dict | None, str]:
    """(resolved config, source spec, data source) of the first of these cell runs."""
    for run_id in run_ids:
        data = evals.artifact_bytes(run_id, "config.json")
        run = client().get_run(run_id)
        source = param(run, "source")
        source = json.loads(source) if isinstance(source, str) and source.startswith("{") else source
        return (json.loads(data) if data else None), (source if isinstance(source, dict) else None), \
            run.data.tags.get(TAG["data_source"], "")
    return None, None, ""


def build_card(method: str, dataset: str | None = None, ipc: int | None = None, boards: Boards | None = None,
               w: float = 0.5, gamma: float = 0.5, alpha: float = 0.5) -> Card:
    """The card of one set. ``dataset`` and ``ipc`` may be left out where the method has one set."""
    boards = boards or load_boards(w, gamma, alpha)
    sets = list_sets(boards, method, dataset, ipc)
    if not sets:
        raise ValueError(f"no finished runs for method {method!r}" + (f" on {dataset}" if dataset else "")
                         + (f" at IPC {ipc}" if ipc is not None else "") + ": run a grid first")
    if len(sets) > 1:
        raise ValueError(f"method {method!r} has several sets {sets}: give --dataset and --ipc")
    method, dataset, ipc = sets[0]
    blocks, headline, seed_counts = [], [], []
    source, data_source, data = None, "", None
    for protocol, name, title, values, keys, score, score_label in _layout():
        board = boards[name]
        rows = board_rows(board, method, dataset, ipc)
        if data is None and not rows.empty and "data" in rows and isinstance(rows["data"].iloc[0], str):
            data = rows["data"].iloc[0]  # the label the cell runs carry (ddlib.data), e.g. "CIFAR-10 (JPEG)"
        main, main_label = score, score_label
        if rows.empty and protocol == "blackbox":  # the set's models crafted the attacks other sets' models met
            surrogate = _as_surrogate(board, method, dataset, ipc)
            if surrogate is not None:
                block, line = surrogate
                blocks.append(block)
                headline.append({"protocol": f"{title} (as surrogate)", **line})
                continue
        if rows.empty:
            blocks.append(Block(protocol, title, False))
            headline.append({"protocol": title, "score": main_label, "value": "not run", "seeds": "", "rank": "",
                             "recipe": "", "epochs": ""})
            continue
        runs = _runs(rows)
        config, found_source, found_data = _cell_info(runs)
        source, data_source = source or found_source, data_source or found_data
        block = Block(protocol, title, True, runs=runs, config=config)
        seed_counts += [int(n) for n in rows["seeds"]]
        caption = (f"Mean over seeds [95 % interval]. {rank_caption(score, list(rows['seeds']))}" if score
                   else f"Mean over seeds [{describe_method(**INTERVALS, seeds=list(rows['seeds']))}].")
        recipes = {str(r): row_recipe(str(r).split()) for r in rows["runs"].fillna("")} if "runs" in rows else {}
        block.tables.append((caption, score_table(board, rows, values, keys, score, recipes)))
        if protocol == "transfer" and not boards["transfer_tau"].empty:
            tau = boards["transfer_tau"]
            tau = tau[(tau["dataset"].astype(str) == dataset) & (tau["ipc"] == ipc)]
            if not tau.empty:
                block.tables.append(("Kendall tau between the method ranking on the reference architecture and "
                                     "on each other one (all methods at this IPC)", tau.round(3)))
        blocks.append(block)
        for _, row in rows.iterrows():
            ranked = main == score and "rank" in row and not pd.isna(row["rank"])
            headline.append({"protocol": title + (f" ({row['mode']})" if "mode" in row else ""),
                             "score": main_label,
                             "value": format_value(main, row.get(f"{main}_mean"), row.get(f"{main}_low"),
                                                   row.get(f"{main}_high")),
                             "seeds": str(row["seeds"]),
                             "rank": f"{int(row['rank'])} of {_compared(board, row)}" if ranked
                             else row.get("unranked") if isinstance(row.get("unranked"), str) else "",
                             **{k: (recipes.get(str(row.get("runs", ""))) or {}).get(k, "") for k in ("recipe", "epochs")},
                             **({"sanity": row["sanity"]} if isinstance(row.get("sanity"), str) and row["sanity"]
                                else {})})
    config = next((b.config for b in blocks if b.ran and b.config), None)
    seeds = config.get("seeds") if config else None
    for block in blocks:
        if not block.ran:
            block.command = run_command(block.protocol, method, dataset, ipc, source, seeds, config)
    card = Card(method, dataset, ipc, data or data_label(dataset, data_source), data_source, blocks, pd.DataFrame(headline),
                settings={"w": boards.w, "gamma": boards.gamma, "alpha": boards.alpha, **INTERVALS,
                          **({"experiment": reading_from()} if reading_from() else {})}, seed_counts=seed_counts,
                created=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    card.image_grid, card.image_note = set_grid_png([r for b in blocks for r in b.runs], ipc)
    card.figures = _figures(card, boards)
    return card


# --------------------------------------------------------------------------- plots


def _figures(card: Card, boards: Boards) -> dict:
    figures = {}
    profiles = {card.method: radar_profile(boards, card.method, card.dataset, card.ipc)}
    if card.method != "random" and list_sets(boards, "random", card.dataset, card.ipc):
        same_setting = radar_families(boards, card.method, card.dataset, card.ipc)  # random of the set's own setting
        profiles["random (same IPC)"] = radar_profile(boards, "random", card.dataset, card.ipc, families=same_setting)
    figures["radar"] = viz.radar(profiles, f"{card.method}, {card.data}, IPC {card.ipc}: scores normalised to [0, 1]")
    points, full, what = ipc_points(boards, card.dataset, [card.method])
    figures["accuracy_vs_ipc"] = viz.accuracy_vs_ipc(points, card.method, full,
                                                     f"{card.data}: accuracy against IPC ({what}; 95 % intervals)") \
        if not points.empty else None
    curves = boards["eps_curves"]
    if not curves.empty:
        curves = curves[(curves["method"].astype(str) == card.method) & (curves["dataset"].astype(str) == card.dataset)]
    figures["robust_accuracy_vs_eps"] = plot_eps_curves(curves) if not curves.empty else None
    figures.update({k: v for k, v in eps_curve_figures(curves).items() if k.startswith("eps_row_")})
    lrs = next((b for b in card.blocks if b.protocol == "label_robust" and b.ran), None)
    cells = lrs.runs if lrs else [r for b in card.blocks for r in b.runs]
    figures["training_loss"] = viz.loss_curves(
        {role: evals.loss_curves(cells, role) for role in ("syn_hard", "rdm_hard", "real_hard")},
        f"{card.method}, IPC {card.ipc}: training loss (syn: the set, rdm: random subset, real: full data)")
    matrix, classes, models = evals.confusion_counts(cells, "syn_hard")
    figures["confusion_matrix"] = viz.confusion(
        matrix, classes, f"Model trained on the set (hard labels): {models} seed{'s' if models != 1 else ''} summed") \
        if matrix is not None else None
    return figures


# --------------------------------------------------------------------------- HTML and MLflow


FIGURE_TITLES = {
    "radar": "Scores at a glance (radar)", "accuracy_vs_ipc": "Accuracy against images per class",
    "robust_accuracy_vs_eps": "Robust accuracy against epsilon", "training_loss": "Training-loss curves",
    "confusion_matrix": "Confusion matrix of the model trained on the set",
}


def render_html(card: Card, pngs: dict[str, bytes] | None = None) -> str:
    """The card as one HTML document (images inline)."""
    pngs = pngs if pngs is not None else figure_pngs(card)
    ipc = "all images" if card.ipc == FULL_IPC else f"IPC {card.ipc}"
    caveat = describe_method(**INTERVALS, seeds=card.seed_counts)
    body = [f"<h1>Report card: {escape(card.method)}, {escape(card.data)}, {escape(ipc)}</h1>",
            _headline(card),
            table_html(card.headline, "Each protocol's score for this set; rank: among the methods compared "
                                      "in the same setting (ties: not significantly different)"),
            f'<p class="muted">Data: {escape(card.data)} (read from <code>{escape(card.data_source or "?")}</code>). '
            f"Scores: LRS w = {card.settings['w']}, ARS gamma = {card.settings['gamma']}, CREI alpha = "
            f"{card.settings['alpha']}. Every value: mean over seeds [{escape(caveat)}]. "
            + (f"Cells read from experiment <code>{escape(card.settings['experiment'])}</code> (--experiment). "
               if card.settings.get("experiment") else "") +
            f"Generated {escape(card.created)} by ddlib.</p>"]
    figs = []
    if card.image_grid:
        figs.append(f"<figure>{image_tag(card.image_grid, 'images of the set', css='setgrid')}<figcaption>"
                    f"{escape(card.image_note)}</figcaption></figure>")
    else:
        figs.append('<p class="notrun">Image grid: not recorded.</p>')
    if pngs.get("radar"):
        figs.append(image_tag(pngs["radar"], FIGURE_TITLES["radar"]))
    body.append(f'<div class="figs">{"".join(figs)}</div>')
    for block in card.blocks:
        body.append(f'<h2 id="{escape(block.protocol)}">{escape(block.title)}</h2>')
        if not block.ran:
            body.append(f'<p class="notrun"><b>not run</b> for this set. Run it with:<br>'
                        f"<code>{escape(block.command)}</code></p>")
            continue
        for caption, table in block.tables:
            body.append(table_html(table, caption, index=table.index.name is None and not table.index.equals(
                pd.RangeIndex(len(table)))))
    body.append("<h2 id=\"plots\">Plots</h2>")
    for name in ("accuracy_vs_ipc", "robust_accuracy_vs_eps", "training_loss", "confusion_matrix"):
        body.append(f"<h3>{escape(FIGURE_TITLES[name])}</h3>")
        body.append(image_tag(pngs[name], FIGURE_TITLES[name]) if pngs.get(name)
                    else '<p class="notrun">not run or not recorded for this set.</p>')
        if name == "robust_accuracy_vs_eps":  # one figure per leaderboard row, a line per attack (plots.py)
            body += [image_tag(pngs[k], "Robust accuracy against epsilon, one row") for k in pngs if k.startswith("eps_row_")]
    body.append("<h2 id=\"provenance\">Configuration and MLflow runs</h2>")
    for block in card.blocks:
        if block.ran:
            body.append(f"<h3>{escape(block.title)}</h3><p>MLflow cell runs: "
                        + ", ".join(f"<code>{escape(r)}</code>" for r in block.runs) + "</p>")
            if block.config is not None:
                body.append("<details><summary>resolved configuration (config.json of the first run)</summary>"
                            f"<pre>{escape(json.dumps(block.config, indent=2, default=str))}</pre></details>")
    return page(f"ddlib report card: {card.name}", "\n".join(body))


def _headline(card: Card) -> str:
    """The card's first line: each protocol's headline score that has run, with its seeds and rank."""
    ran = card.headline[card.headline["value"] != "not run"]
    if ran.empty:
        return '<p class="headline" id="headline">No protocol has run for this set.</p>'
    parts = [f"<b>{escape(str(r['score']))} {escape(str(r['value']))}</b> ({escape(str(r['protocol']))}; "
             f"{escape(str(r['seeds']))} seed{'s' if str(r['seeds']) != '1' else ''}"
             + (f", {escape(str(r['rank']))}" if str(r["rank"]).startswith("not ranked")
                else f", rank {escape(str(r['rank']))}" if r["rank"] else "") + ")" for _, r in ran.iterrows()]
    return '<p class="headline" id="headline">' + " &middot; ".join(parts) + "</p>"


def figure_pngs(card: Card) -> dict[str, bytes]:
    """Every figure of the card as PNG bytes (rendered once; the figures are closed)."""
    out = {}
    for name, fig in card.figures.items():
        if fig is not None:
            out[name] = figure_png(fig)
    card.figures = {}
    return out


def log_card(card: Card, html: str, pngs: dict[str, bytes]) -> str:
    """Log the page (``report.html``) and its plots (``plots/*.png``) as artifacts of a new run in
    experiment ``report``; returns the run id."""
    tracker = Tracker("report")
    run_id = tracker.start_run(card.name, params={"method": card.method, "dataset": card.dataset, "ipc": card.ipc,
                                                  **card.settings},
                               tags={**default_tags("report"), TAG["kind"]: "report", **source_tags()})
    with tempfile.TemporaryDirectory(prefix="ddlib-card-") as tmp:
        page_path = Path(tmp) / "report.html"
        page_path.write_text(html)
        tracker.log_artifact(run_id, page_path)
        for name, data in pngs.items():
            path = Path(tmp) / f"{name}.png"
            path.write_bytes(data)
            tracker.log_artifact(run_id, path, "plots")
        if card.image_grid:
            path = Path(tmp) / "images.png"
            path.write_bytes(card.image_grid)
            tracker.log_artifact(run_id, path, "plots")
    tracker.set_tags(run_id, {"ddlib.report_cells": " ".join(r for b in card.blocks for r in b.runs)[:5000]})
    tracker.end_run(run_id)
    return run_id


def write_card(card: Card, path: str | Path | None = None, log: bool = True) -> tuple[Path | None, str | None]:
    """Render the card, write it to ``path`` (if given) and log it to MLflow (if ``log``)."""
    pngs = figure_pngs(card)
    html = render_html(card, pngs)
    written = None
    if path is not None:
        written = Path(path)
        written.parent.mkdir(parents=True, exist_ok=True)
        written.write_text(html)
    run_id = log_card(card, html, pngs) if log else None
    return written, run_id
