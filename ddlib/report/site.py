"""A static leaderboard site generated from MLflow: ``python -m ddlib leaderboard --out site/``.

``index.html`` lists one page per leaderboard x dataset x IPC; each page holds the leaderboard as
a sortable table (click a header; a few lines of inline script, no server), every value as its mean
over seeds with its bootstrap interval, the rank groups (methods not significantly different share
a rank and are listed as "tied with"), the table as CSV beside the page, and its plots as PNG files
beside it. ``cards/`` holds the report card of every set (:mod:`ddlib.report.card`), linked from the
tables. Open ``index.html`` from disk or serve the folder with any static server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ddlib.boards.rank import INTERVALS, rank_caption
from ddlib.boards.read import reading_from
from ddlib.boards.table import display_format, format_leaderboard, shown_board
from ddlib.protocols.beard_boards import eps_curve_figures, plot_eps_curves
from ddlib.protocols.common import FULL_IPC
from ddlib.protocols.ddranking_boards import weight_sweep
from ddlib.report import card as cards, viz
from ddlib.report.boards import load_boards, one_read
from ddlib.report.plots import ipc_points, radar_profile
from ddlib.report.sources import cells_elsewhere, elsewhere_note
from ddlib.report.export import row_recipe
from ddlib.report.html import escape, figure_png, image_tag, page, table_html
from ddlib.report.stability import stability_table
from ddlib.protocols.spec import Board, board_specs
from ddlib.scores.stats import describe_method

__all__ = ["Page", "build_site"]



@dataclass
class Page:
    """One page of the leaderboard site: a board at one dataset and IPC."""

    board: str
    dataset: str
    ipc: str  # "10", "all" (the full training set) or "all IPCs" (unified over IPCs)
    file: str
    rows: int
    leader: str


def _slug(*parts) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(str(p) for p in parts)).strip("_")


def _ipc_label(ipc) -> str:
    return "all" if ipc == FULL_IPC else str(ipc)


def _score_plot(board: pd.DataFrame, score: str, title: str):
    """The board's score per row with its interval, best first."""
    import matplotlib.pyplot as plt

    column = f"{score}_mean"
    if column not in board or board[column].isna().all():
        return None
    rows = board.dropna(subset=[column]).sort_values(column)
    labels = [f"{m}" + (f" [{v}]" if v else "") for m, v in
              zip(rows["method"].astype(str), _variants(rows))]
    scale, _ = display_format(score)
    mean = rows[column] * scale
    low = (rows[column] - rows[f"{score}_low"]).fillna(0) * scale
    high = (rows[f"{score}_high"] - rows[column]).fillna(0) * scale
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.6))
    ax.barh(range(len(rows)), mean, xerr=[low, high], capsize=3, color="tab:blue", alpha=0.8)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.set_xlabel(f"{score.upper()} (mean over seeds, 95 % interval)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def _variants(rows: pd.DataFrame) -> list[str]:
    """What tells rows of one method apart on a page (model, preset, mode, ...), where anything does."""
    keys = [k for k in ("model", "preset", "mode", "training", "precision", "set", "config")
            if k in rows and rows[k].nunique() > 1]
    return [", ".join(str(r[k]) for k in keys) for _, r in rows.iterrows()]


def _shown(board: pd.DataFrame, card_names: dict, score: str | None = None, recipes: dict | None = None) -> pd.DataFrame:
    """The page's table: card, method, the row's recipe and epochs, then the headline score with its
    rank (so they are on screen without scrolling sideways), then the rest."""
    shown = format_leaderboard(board, intervals=True)
    drop = [c for c in ("dataset", "ipc", "ipcs") if c in shown and shown[c].nunique() <= 1]
    shown = shown.drop(columns=drop)
    if "runs" in board:
        recipes = recipes if recipes is not None else {}
        made = pd.DataFrame([recipes.get(str(r)) or row_recipe(str(r).split()) for r in board["runs"].fillna("")],
                            index=shown.index, columns=["recipe", "epochs"])
        shown = pd.concat([shown, made], axis=1)
    if card_names and "method" in shown:
        shown.insert(0, "card", [card_names.get((str(m), str(d), int(i)), "") if "ipc" in board else ""
                                 for m, d, i in zip(board["method"], board["dataset"],
                                                    board["ipc"] if "ipc" in board else [0] * len(board))])
    headline = score.upper() if score and score.upper() in shown else None
    first = [c for c in ("card", "method", "recipe", "epochs", headline, "rank", "sanity", "tied with", "seeds")
             if c in shown]  # sanity beside the rank: why a row is no result (test images in its set) is on screen
    return shown[first + [c for c in shown.columns if c not in first]]


def _headline(sub: pd.DataFrame, board: Board, recipes: dict) -> str:
    """The page's first line: the best row's headline score (the highest, or the lowest where the
    board's score is better low), what made it, its seeds and rank group. Rows left out of the ranking
    (their set holds test images) are never the best."""
    score = board.score
    if not score or f"{score}_mean" not in sub:
        return ""
    candidates = sub[sub["unranked"].fillna("") == ""] if "unranked" in sub else sub
    candidates = candidates[candidates[f"{score}_mean"].notna()]
    if candidates.empty:
        return ""
    best = candidates.loc[candidates[f"{score}_mean"].idxmax() if board.higher_is_better
                          else candidates[f"{score}_mean"].idxmin()]
    value = cards.format_value(score, best[f"{score}_mean"], best.get(f"{score}_low"), best.get(f"{score}_high"))
    recipe = recipes.get(str(best.get("runs", "")), {})
    made, epochs = recipe.get("recipe") or "", recipe.get("epochs") or ""
    if epochs and f"epochs {epochs}" not in made:  # a preset's, or preset_epochs
        made = f"{made}, {epochs} epochs" if made else f"{epochs} epochs"
    rank = ""
    if "rank" in best and not pd.isna(best["rank"]):
        rank = f"; rank {int(best['rank'])}" + (f", tied with {best['tied_with']}" if best.get("tied_with") else "")
    label = board.label or score.upper()
    which = "Best" if board.higher_is_better else "Lowest (lower is better)"
    return (f'<p class="headline" id="headline">{which} {escape(label)}: <b>{escape(value)}</b> by '
            f"<b>{escape(str(best['method']))}</b>" + (f" ({escape(made)})" if made else "")
            + f" &middot; {int(best['seeds'])} seed{'s' if int(best['seeds']) != 1 else ''}{escape(rank)}</p>")


def _table_with_links(shown: pd.DataFrame, caption: str) -> str:
    text = table_html(shown, caption, sortable=True)
    # card file names were put in the "card" column: turn them into links (the names are our own slugs)
    return re.sub(r"<td>(cards/[A-Za-z0-9_.-]+\.html)</td>", r'<td><a href="\1">card</a></td>', text)


@one_read()
def build_site(out: str | Path, w: float = 0.5, gamma: float = 0.5, alpha: float = 0.5,
               with_cards: bool = True, progress: bool = False) -> list[Page]:
    """Write the site under ``out``; returns its pages (empty where MLflow has no finished cells)."""
    out = Path(out)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    boards = load_boards(w, gamma, alpha)
    specs = {name: board for name, (_, board) in board_specs().items()}  # every protocol's boards, with titles and scores
    tables = {name: boards[name] for name in specs}
    sweeps = {name: weight_sweep(name) for name, board in specs.items() if "sweep" in board.pages}

    card_names = {}
    if with_cards:
        sets = cards.list_sets(boards)
        for method, dataset, ipc in _progress(sets, progress, "report cards"):
            card = cards.build_card(method, dataset, ipc, boards=boards)
            file = f"cards/{_slug(card.name)}.html"
            cards.write_card(card, out / file, log=False)
            card_names[(method, dataset, ipc)] = file

    pages: list[Page] = []
    for name, board in tables.items():
        if board.empty:
            continue
        score = specs[name].score
        by = ["dataset", "ipc"] if "ipc" in board else ["dataset"]
        for key, sub in board.groupby(by, sort=True):
            key = key if isinstance(key, tuple) else (key,)
            dataset, ipc = str(key[0]), (_ipc_label(key[1]) if len(key) > 1 else "all IPCs")
            slug = _slug(name, dataset, f"ipc{ipc}" if len(key) > 1 else "unified")
            sub = sub.reset_index(drop=True)
            shown_board(sub).to_csv(out / f"{slug}.csv", index=False)  # numbers in ddlib.specs.units' units
            title = f"{specs[name].title}: {dataset}, IPC {ipc}"
            seeds = list(sub["seeds"]) if "seeds" in sub else None
            caption = (f"Every value: mean over seeds [95 % interval]. {rank_caption(score, seeds)}"
                       if score and "rank" in sub and sub["rank"].notna().any()
                       else f"Every value: mean over seeds [95 % interval]; {describe_method(**INTERVALS, seeds=seeds)}.")
            recipes = {str(r): row_recipe(str(r).split()) for r in sub["runs"].fillna("")} if "runs" in sub else {}
            body = [f'<nav><a href="index.html">all leaderboards</a></nav><h1>{escape(title)}</h1>',
                    _headline(sub, specs[name], recipes),
                    _table_with_links(_shown(sub, card_names, score, recipes), caption),
                    f'<p class="muted">{len(sub)} rows; click a column header to sort. '
                    f'Data: <a href="{slug}.csv">{slug}.csv</a> (every mean, std, interval and the per-seed '
                    f"scores, with the MLflow runs of each row).</p>"]
            figures = {}
            if score and f"{score}_mean" in sub:
                figures["scores"] = _score_plot(sub, score, f"{title}: {score.upper()} with 95 % intervals")
            if "radar" in specs[name].pages and len(key) > 1:
                profiles = {m: radar_profile(boards, m, dataset, key[1]) for m in sub["method"].astype(str).unique()}
                figures["radar"] = viz.radar(profiles, f"{dataset}, IPC {ipc}: every method's scores, normalised")
            if "accuracy_vs_ipc" in specs[name].pages:
                points, full, what = ipc_points(boards, dataset, list(sub["method"].astype(str).unique()))
                if not points.empty:
                    figures["accuracy_vs_ipc"] = viz.accuracy_vs_ipc(points, None, full,
                                                                     f"{dataset}: accuracy against IPC ({what})")
            if "eps_curves" in specs[name].pages and not boards["eps_curves"].empty:
                curves = boards["eps_curves"]
                curves = curves[(curves["dataset"].astype(str) == dataset) & (curves["ipc"] == key[1])]
                if not curves.empty:
                    figures["eps"] = plot_eps_curves(curves)
                    figures.update({k: v for k, v in eps_curve_figures(curves).items() if k.startswith("eps_methods_")})
            if name in sweeps and not sweeps[name].empty:
                sweep = sweeps[name]
                sweep = sweep[(sweep["dataset"].astype(str) == dataset) & (sweep["ipc"] == key[1])]
                body.append(table_html(sweep.round(2), f"{name.upper()} (mean over seeds) at each weight of "
                                                       "DD-Ranking's sweep", sortable=True))
            images = []
            for fig_name, fig in figures.items():
                if fig is None:
                    continue
                file = f"plots/{slug}-{fig_name}.png"
                (out / file).write_bytes(figure_png(fig))
                images.append(image_tag(src=file, alt=f"{title}: {fig_name}"))
            if images:
                body.append(f'<h2>Plots</h2><div class="figs">{"".join(images)}</div>')
            (out / f"{slug}.html").write_text(page(title, "\n".join(body), sortable=True))
            leader = ""
            if score and f"{score}_mean" in sub and sub[f"{score}_mean"].notna().any():
                best = sub.loc[sub[f"{score}_mean"].idxmax()]
                value = cards.format_value(score, best[f"{score}_mean"], best[f"{score}_low"], best[f"{score}_high"])
                leader = f"{best['method']} ({score.upper()} {value})"
            pages.append(Page(name, dataset, ipc, f"{slug}.html", len(sub), leader))
    _index(out, pages, card_names, tables)
    return pages


def _seed_counts(tables: dict) -> list[int]:
    return [int(n) for t in tables.values() if not t.empty and "seeds" in t for n in t["seeds"].dropna()]


def _progress(items, show: bool, desc: str):
    if not show:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc)


def _index(out: Path, pages: list[Page], card_names: dict, tables: dict) -> None:
    body = ["<h1>ddlib leaderboards</h1>",
            f'<p class="muted">Generated from MLflow by <code>python -m ddlib leaderboard</code>. Every value is a mean '
            f"over seeds with its {describe_method(**INTERVALS, seeds=_seed_counts(tables))}. Methods whose scores are not "
            f"significantly different (paired by seed) share a rank.</p>"]
    if reading_from():
        body.append(f'<p>The boards of experiment <code>{escape(reading_from())}</code> (each protocol\'s cells in '
                    "it; <code>--experiment</code>), not of the protocols' own experiments.</p>")
    elsewhere = cells_elsewhere()
    if elsewhere:
        body.append(f'<p class="notrun">{escape(elsewhere_note(elsewhere, "Not on these leaderboards"))}</p>')
    if not pages:
        body.append('<p class="notrun">No finished runs yet: <code>python -m ddlib run params/demo.yaml</code></p>')
    else:
        titles = {name: board.title for name, (_, board) in board_specs().items()}
        index = pd.DataFrame([{"leaderboard": titles[p.board], "dataset": p.dataset, "IPC": p.ipc, "rows": p.rows,
                               "leader": p.leader, "page": p.file} for p in pages])
        text = table_html(index, "One page per leaderboard x dataset x IPC", sortable=True)
        text = re.sub(r"<td>([A-Za-z0-9_.-]+\.html)</td>", r'<td><a href="\1">\1</a></td>', text)
        body += ["<h2>Leaderboards</h2>", text]
        stability = stability_table(tables)
        if not stability.empty:
            stability.to_csv(out / "rank_stability.csv", index=False)
            body += ["<h2>Rank stability</h2>",
                     table_html(stability.round(3), "Kendall tau-b of the method ranking under each setting (a seed, "
                                "an architecture, a score weight) against the leaderboard's (mean over seeds, the "
                                "reference architecture, weight 0.5); blocks of 3 or more methods", sortable=True)]
    if card_names:
        listed = pd.DataFrame([{"method": m, "dataset": d, "IPC": _ipc_label(i), "card": f}
                               for (m, d, i), f in sorted(card_names.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2]))])
        text = table_html(listed, "One report card per distilled set", sortable=True)
        text = re.sub(r"<td>(cards/[A-Za-z0-9_.-]+\.html)</td>", r'<td><a href="\1">\1</a></td>', text)
        body += ["<h2>Report cards</h2>", text]
    (out / "index.html").write_text(page("ddlib leaderboards", "\n".join(body), sortable=True))
