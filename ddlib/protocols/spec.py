"""One description per protocol: what the runner, ``ddlib score``, the notebooks' parameters cells,
the dry run, every leaderboard, the report card, the site and the docs read.

A protocol is a module of :mod:`ddlib.protocols` that declares ``SPEC = ProtocolSpec(...)`` (its
name, revision, typed parameters with one-line help, notebook, leaderboards, headline score) and
the steps its notebook calls: ``validate(params)``, ``open_cell(**params)``, ``obtain(cell)`` and
``evaluate(cell, distilled) -> Result``. Adding one is that module, its notebook (whose parameters
cell :func:`parameters_source` writes from the spec) and a params file: protocols are found by
reading the package's modules for a ``SPEC = ProtocolSpec(name=...)`` assignment, without
importing them (the command line stays light), and imported on first use.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import sys
import traceback
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from ddlib.boards import known as known_to_boards
from ddlib.specs.registry import Registry
from ddlib.specs.shown import one_line

__all__ = ["Param", "Board", "BEYOND_COLUMNS", "ProtocolSpec", "Result",
           "PROTOCOLS", "set_protocols", "get_spec", "all_specs",
           "protocol_module", "parameters_source", "board_specs", "notebook_folder", "PATH_ENV",
           "ProtocolLoadError", "score_columns", "value_names", "board_score"]


@dataclass(frozen=True)
class Param:
    """One parameter of a protocol: its default, a one-line help, and its type as papermill's
    ``--help-notebook`` shows it (inferred from the default where not given)."""

    default: Any
    help: str = ""  # one line, without "=" (papermill reads "name: type = value  # help")
    type: str = ""

    def __post_init__(self):
        if "=" in self.help or "\n" in self.help:
            raise ValueError(f"a parameter's help is one line without '=' (papermill's parser), got {self.help!r}")

    @property
    def type_name(self) -> str:
        if self.type:
            return self.type
        for kind, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"), (list, "list"),
                           (dict, "dict")):
            if isinstance(self.default, kind):
                return name
        return "Any"


@dataclass(frozen=True)
class Board:
    """A leaderboard a protocol's cells fill. ``score`` is the value its rows are ranked by, that the
    report card headlines and rank stability follows: one choice, made here."""

    name: str  # "lrs": the key in load_boards(), the site's page names, ``ddlib export --board``
    title: str
    build: str  # "module:function" computing it from MLflow (a weight keyword, if any, is ``weight``)
    score: str | None  # the ranked value (without _mean); None: the board is not ranked
    label: str = ""  # the score's short name ("LRS")
    columns: tuple[tuple[str, str], ...] = ()  # (value, what it is) as the report card lists them
    more_columns: bool = False  # the card also lists the board's other value columns
    variant: tuple[str, ...] = ()  # the columns that tell one set's rows apart on the card
    weight: str | None = None  # "w", "gamma", "alpha": the board's score weight (the CLI's --w, ...)
    higher_is_better: bool = True  # False: the score is headlined, not ranked (leaderboards rank higher first)
    heading: str = ""  # the summary's section title ("{weight}": the weight as set), else the title
    section: str = ""  # "module:function(name, board, boards, plots) -> (tables, figures)" shown beside it
    derived: tuple[tuple[str, str], ...] = ()  # (table, "module:function(board)"): read beside it by every report
    own_section: bool = True  # False: shown within its protocol's first board's section (BEARD's unified board)
    pages: tuple[str, ...] = ()  # what the site's pages of it show beside the table: "radar", "accuracy_vs_ipc",
    # "eps_curves" (figures across boards), "sweep" (the score at each weight of DD-Ranking's sweep)


# Extra (non-headline) columns of the boards that carry them (ddlib.protocols.beyond): the calibration and
# class-wise fairness of the models the board's headline accuracy comes from, and the cell's cost.
BEYOND_COLUMNS = (("ece", "ECE, 15 equal-width bins (the set's models)"), ("nll", "test NLL (the set's models)"),
                  ("worst_class_acc", "worst-class accuracy (the set's models)"),
                  ("class_acc_range", "max - min of the per-class accuracies (the set's models)"),
                  ("train_flops", "training FLOPs of the set's models (3 x forward x images seen)"),
                  ("train_seconds", "training wall time of the set's models (s; see devices)"))


@dataclass(frozen=True)
class ProtocolSpec:
    """Everything a protocol declares: name, revision, parameters with help, notebook, boards, headline score."""

    name: str
    revision: int  # bump it whenever what the protocol computes changes (part of every key)
    title: str
    summary: str  # one line: what a cell computes
    params: Mapping[str, Param]
    boards: tuple[Board, ...]
    headline: str  # the board whose score the report card and the overview show for this protocol
    order: int = 100  # where the protocol stands in reports (cards, the site): DD-Ranking, BEARD, DC-Bench
    module: str = ""  # set by get_spec: the module that declares the spec (its notebook: notebooks/<name>.ipynb)
    takes_set: bool = True  # scores a set file (``ddlib score``); NAS also needs a ground truth
    path_params: tuple[str, ...] = ()  # parameters holding paths (made absolute by the runner)
    history: tuple[str, ...] = field(default=(), repr=False)  # what each revision changed

    def defaults(self) -> dict:
        """The parameters with their defaults (what a cell is validated against)."""
        return {name: param.default for name, param in self.params.items()}

    @property
    def notebook(self) -> str:
        return f"{self.name}.ipynb"

    def board(self, name: str | None = None) -> Board:
        """The headline board, or the board ``name``."""
        wanted = name or self.headline
        for board in self.boards:
            if board.name == wanted:
                return board
        raise ValueError(f"protocol {self.name!r} has no board {wanted!r}; it has {[b.name for b in self.boards]}")


@dataclass(kw_only=True)
class Result:
    """What ``evaluate(cell, distilled)`` returns: one row per seed, the mean/std summary the cell
    logged, and the cell's MLflow run. Protocols add fields of their own."""

    per_seed: pd.DataFrame  # in shown units (ddlib.specs.units: accuracies in %, ...), as the CLI and MLflow show them
    summary: dict[str, float]  # <value>_mean and <value>_std, in shown units
    run_id: str | None = None
    protocol: str = ""  # which protocol computed it (its headline board says which values are its scores)

    def table(self) -> pd.DataFrame:
        """Every value of the summary as mean and std, one row each, in the order logged."""
        keys = [k[: -len("_mean")] for k in self.summary if k.endswith("_mean")]
        return pd.DataFrame({"mean": [self.summary[f"{k}_mean"] for k in keys],
                             "std": [self.summary.get(f"{k}_std", float("nan")) for k in keys]}, index=keys)

    def values(self, columns: str = "scores") -> pd.DataFrame:
        """The values as ``ddlib score`` prints them (:func:`ddlib.scores.tables.value_table`: unit, mean, std,
        bootstrap interval, each seed): ``columns="scores"`` the protocol's scores, ``"all"`` every value."""
        from ddlib.scores.tables import value_table

        return value_table(self.per_seed, value_names(self.protocol, self.per_seed, columns))


# --------------------------------------------------------------------------- the registry

_LOADED: Registry = Registry("protocol")  # the imported protocols: name -> evaluate; meta["spec"]: its ProtocolSpec
_PACKAGE = Path(__file__).resolve().parent


PATH_ENV = "DDLIB_PROTOCOL_PATH"  # more folders of protocol modules (os.pathsep-separated), beside the package's
# A protocol's name in a file of PATH_ENV that does not parse: its own error is given when it is asked for.
_NAMED = re.compile(rb"""SPEC\s*=\s*ProtocolSpec\(\s*name\s*=\s*["']([A-Za-z0-9_]+)["']""")
_FAILED: dict[str, "ProtocolLoadError"] = {}  # file -> why importing it failed (imported once per process)
_WARNED: set[str] = set()


class ProtocolLoadError(ValueError):
    """A protocol module of :data:`PATH_ENV` cannot be read or imported; names the file and the problem."""


def _warn(problem: str) -> None:
    """One warning line on stderr per problem and process: a broken file of :data:`PATH_ENV` is skipped and
    every other protocol (the package's included) runs."""
    if problem not in _WARNED:
        _WARNED.add(problem)
        print(f"warning: {problem}; skipped ({PATH_ENV})", file=sys.stderr)


def _problem(path: Path, error: BaseException) -> str:
    """Why a protocol file cannot be read or imported, in one line naming it (and the line at fault)."""
    if isinstance(error, OSError):
        return f"{path}: cannot read ({error.strerror or error})"
    if isinstance(error, SyntaxError):  # the file's own, or a module it imports
        other = error.filename if error.filename not in (None, str(path), "<unknown>") else None
        at = ", ".join(x for x in (other, f"line {error.lineno}" if error.lineno else None) if x)
        return f"{path}: not valid Python: {error.msg}" + (f" ({at})" if at else "")
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == str(path)]
    return (f"{path}: importing it raised {type(error).__name__}: {one_line(error, 300)}"
            + (f" (line {frames[-1].lineno})" if frames else ""))


def _declared() -> dict[str, dict]:
    """protocol name -> its module (and, for one outside the package, its file and folder) and the
    spec's literal keywords (``takes_set``), read from the files without importing them: the
    package's modules, then those of :data:`PATH_ENV`'s folders (a protocol of your own: a module,
    its notebook beside it, a params file). A file there that cannot be read or parsed is skipped
    with a warning; where its protocol's name can still be read, asking for it gives its error."""
    extra = tuple(p for p in os.environ.get(PATH_ENV, "").split(os.pathsep) if p)
    return _scan(extra)


def _declarations(path: Path) -> dict[str, bool]:
    """The protocols a module declares (``SPEC = ProtocolSpec(name=...)``): name -> takes_set. Bytes are
    parsed as Python reads a source file (its encoding declaration, else UTF-8)."""
    data = path.read_bytes()
    if b"ProtocolSpec(" not in data:  # a helper module: none of discovery's business, whatever its bytes
        return {}
    found = {}
    for node in ast.parse(data, filename=str(path)).body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SPEC" for t in node.targets)
                and isinstance(node.value, ast.Call)):
            literal = {k.arg: k.value.value for k in node.value.keywords if isinstance(k.value, ast.Constant)}
            if isinstance(literal.get("name"), str):
                found.setdefault(literal["name"], literal.get("takes_set", True))
    return found


@lru_cache(maxsize=8)
def _scan(extra: tuple[str, ...]) -> dict[str, dict]:
    found = {}
    folders = [(_PACKAGE, True)] + [(Path(folder).expanduser().resolve(), False) for folder in extra]
    for folder, inside in folders:
        for path in sorted(folder.glob("*.py")):
            if path.name.startswith("_") or (inside and path.name == "spec.py"):
                continue
            place = {"file": None, "folder": None} if inside else {"file": str(path), "folder": str(folder)}
            try:
                declared = _declarations(path)
            except (OSError, SyntaxError, ValueError) as error:  # ValueError: null bytes (before Python 3.12)
                if inside:
                    raise
                problem = _problem(path, error if isinstance(error, (OSError, SyntaxError)) else SyntaxError(str(error)))
                named = _NAMED.search(path.read_bytes()) if not isinstance(error, OSError) else None
                if named and named.group(1).decode() not in found:
                    name = named.group(1).decode()
                    found[name] = {"module": f"ddlib_protocol_{name}", "takes_set": True, **place, "error": problem}
                else:
                    _warn(problem)
                continue
            for name, takes_set in declared.items():
                if name not in found:
                    module = f"ddlib.protocols.{path.stem}" if inside else f"ddlib_protocol_{name}"
                    found[name] = {"module": module, "takes_set": takes_set, **place}
    return found


def notebook_folder(name: str) -> Path | None:
    """Where a protocol's notebook is when it is not one of ddlib's (beside its module), else None."""
    folder = _declared()[name]["folder"]
    return Path(folder) if folder else None


def set_protocols() -> list[str]:
    """The protocols that score a set file (``ddlib score``), without importing one."""
    return [name for name, found in sorted(_declared().items()) if found["takes_set"]]


class _Protocols(Mapping):
    """Every protocol, read from the declarations without importing one (:func:`_declared`, so a
    folder added to :data:`PATH_ENV` counts at once): name -> (its notebook's file name, its module)."""

    def __getitem__(self, name: str) -> tuple[str, str]:
        return f"{name}.ipynb", _declared()[name]["module"]

    def __iter__(self):
        return iter(sorted(_declared()))

    def __len__(self) -> int:
        return len(_declared())

    def __contains__(self, name: object) -> bool:
        return name in _declared()


PROTOCOLS = _Protocols()  # the one list of protocols: ``sorted(PROTOCOLS)``, ``name in PROTOCOLS``


def protocol_module(name: str):
    """The protocol's module, imported on first use; one of :data:`PATH_ENV` that cannot be parsed or
    imported is a :class:`ProtocolLoadError` naming its file and the problem (every time it is asked for,
    without importing it again)."""
    found = _declared().get(name)
    if found is None:
        raise ValueError(f"unknown protocol {name!r}; known: {sorted(PROTOCOLS)}")
    if found["file"] is None:
        return importlib.import_module(found["module"])
    if found.get("error"):
        raise ProtocolLoadError(found["error"])
    if found["file"] in _FAILED:
        raise _FAILED[found["file"]]
    if found["module"] not in sys.modules:  # a protocol of your own: imported from its file, once
        loader = importlib.util.spec_from_file_location(found["module"], found["file"])
        module = importlib.util.module_from_spec(loader)
        sys.modules[found["module"]] = module
        try:
            loader.loader.exec_module(module)
        except Exception as error:  # noqa: BLE001 - its error, named, instead of a traceback of every command
            del sys.modules[found["module"]]  # no half-imported module for the next caller
            _FAILED[found["file"]] = ProtocolLoadError(_problem(Path(found["file"]), error))
            raise _FAILED[found["file"]] from None
    return sys.modules[found["module"]]


def get_spec(name: str) -> ProtocolSpec:
    """The protocol's spec (its module imported, and registered, on first use)."""
    if name not in _LOADED:
        module = protocol_module(name)
        spec = getattr(module, "SPEC", None)
        where = getattr(module, "__file__", None) or module.__name__
        if not isinstance(spec, ProtocolSpec):
            raise ProtocolLoadError(f"{where}: SPEC is not a ProtocolSpec, got {type(spec).__name__}")
        if spec.name != name:
            raise ProtocolLoadError(f"{where}: SPEC names protocol {spec.name!r}, its file says {name!r}")
        if not callable(getattr(module, "evaluate", None)):
            raise ProtocolLoadError(f"{where}: protocol {name!r} has no evaluate(cell, distilled) function")
        object.__setattr__(spec, "module", module.__name__)
        _LOADED.add(name, module.evaluate, defaults=spec.defaults(), spec=spec)
    return _LOADED.entry(name).meta["spec"]


def all_specs() -> list[ProtocolSpec]:
    """Every protocol's spec, in report order; one of :data:`PATH_ENV` that cannot be imported is left
    out with a warning (the summary, the reports and the site show the rest)."""
    specs = []
    for name in PROTOCOLS:
        try:
            specs.append(get_spec(name))
        except ProtocolLoadError as error:
            _warn(str(error))
    return sorted(specs, key=lambda spec: (spec.order, spec.name))


def score_columns(protocol: str, per_seed: pd.DataFrame | None = None) -> list[str] | None:
    """The values a result of ``protocol`` is read by, headline first: its headline board's score and
    the columns the board defines (those ``per_seed`` holds, where given). None for an unknown protocol
    (every value is shown)."""
    try:
        board = get_spec(protocol).board()
    except (ValueError, KeyError):
        return None
    names = list(dict.fromkeys([*([board.score] if board.score else []), *(c for c, _ in board.columns)]))
    return names if per_seed is None else [n for n in names if n in per_seed]


def value_names(protocol: str, per_seed: pd.DataFrame, columns: str = "scores") -> list[str]:
    """The values a result shows, in order: ``"scores"`` its protocol's scores (:func:`score_columns`),
    ``"all"`` those first, then every other value it has."""
    if columns not in ("scores", "all"):
        raise ValueError(f"columns must be 'scores' or 'all', got {columns!r}")
    every = [c for c in per_seed.columns if c != "seed"]
    scores = score_columns(protocol, per_seed)
    if scores is None:
        return every
    return scores if columns == "scores" else scores + [c for c in every if c not in scores]


def board_specs() -> dict[str, tuple[ProtocolSpec, Board]]:
    """Every leaderboard of every protocol: board name -> (its protocol, the board)."""
    return {board.name: (spec, board) for spec in all_specs() for board in spec.boards}


def board_score(name: str) -> str | None:
    """The value a board ranks by: its protocol spec says (:class:`Board`), so the ranking, the report
    card's headline and rank stability use one and the same."""
    return board_specs()[name][1].score


def _current_revision(name: str) -> int | None:
    """A protocol's revision now, None where it cannot be told here (not installed, a file that fails)."""
    try:
        return get_spec(name).revision
    except (KeyError, ValueError, TypeError, ImportError, ProtocolLoadError):
        return None


known_to_boards.tell(lambda: PROTOCOLS, _current_revision)  # the boards (below) read which experiments are protocols'


# --------------------------------------------------------------------------- notebooks

# every protocol's revision after the one that made the data row-major (a history entry of each spec)
LAYOUT_REVISION = ("tensors in row-major layout (ddlib.data.layout): on 1-channel data such as digits, whose loader "
                   "kept stride 1 on the channel axis, the convolutions round otherwise; 3-channel data as before")
# every protocol's revision after the one that made every reuse key carry the definition (issue 54.1)
IDENTITY_REVISION = ("every reuse key (trained models, lr searches, teachers, cached results) holds the definition "
                     "(ddlib.specs.keys.ENGINE_REVISION and the protocol's revision) and digests of every tensor that "
                     "enters it (train, validation, test images and labels, the ZCA fit): nothing stored under an "
                     "earlier revision is reused")
RUN_PARAMS = ("run_id", "experiment")  # the runner's own: which MLflow run and experiment a cell writes to


def parameters_source(spec: ProtocolSpec) -> str:
    """The notebook's parameters cell, written from the spec: ``name: type = value  # help``, the
    form papermill's ``--help-notebook`` reads (with ``run_id`` and ``experiment`` first)."""
    lines = ["# Parameters (papermill: -p name value, -y for lists and mappings); written from the protocol's SPEC",
             "run_id: str = None  # the MLflow run the batch runner opened for this cell (None: the notebook opens one)",
             f"experiment: str = {spec.name!r}  # the MLflow experiment"]
    for name, param in spec.params.items():
        lines.append(f"{name}: {param.type_name} = {param.default!r}" + (f"  # {param.help}" if param.help else ""))
    return "\n".join(lines)


def sync_notebook(spec: ProtocolSpec, folder: Path) -> bool:
    """Write the spec's parameters cell into ``folder/<name>.ipynb``; True if it changed."""
    import json

    path = folder / spec.notebook
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"{path}: expected one cell tagged 'parameters', found {len(cells)}")
    source = parameters_source(spec)
    if "".join(cells[0]["source"]) == source:
        return False
    cells[0]["source"] = source.splitlines(keepends=True)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return True

