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
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from ddlib.registry import Registry

__all__ = ["Param", "Board", "BEYOND_COLUMNS", "ProtocolSpec", "Result",
           "REGISTRY", "protocol_names", "set_protocols", "get_spec", "all_specs",
           "protocol_module", "parameters_source", "board_specs", "notebook_folder", "PATH_ENV"]


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


# Extra (non-headline) columns of the boards that carry them (ddlib.protocols.beyond): the calibration and
# class-wise fairness of the models the board's headline accuracy comes from, and the cell's cost.
BEYOND_COLUMNS = (("ece", "ECE, 15 equal-width bins (the set's models)"), ("nll", "test NLL (the set's models)"),
                  ("worst_class_acc", "worst-class accuracy (the set's models)"),
                  ("class_acc_range", "max - min of the per-class accuracies (the set's models)"),
                  ("train_flops", "training FLOPs of the set's models (3 x forward x images seen)"),
                  ("train_seconds", "training wall time of the set's models (s; see devices)"))


@dataclass(frozen=True)
class ProtocolSpec:
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

    per_seed: pd.DataFrame
    summary: dict[str, float]
    run_id: str | None = None

    def table(self) -> pd.DataFrame:
        """Every value of the summary as mean and std, one row each, in the order logged."""
        keys = [k[: -len("_mean")] for k in self.summary if k.endswith("_mean")]
        return pd.DataFrame({"mean": [self.summary[f"{k}_mean"] for k in keys],
                             "std": [self.summary.get(f"{k}_std", float("nan")) for k in keys]}, index=keys)


# --------------------------------------------------------------------------- the registry

REGISTRY: Registry = Registry("protocol")  # name -> the module's evaluate; meta["spec"]: its ProtocolSpec
_PACKAGE = Path(__file__).resolve().parent


PATH_ENV = "DDLIB_PROTOCOL_PATH"  # more folders of protocol modules (os.pathsep-separated), beside the package's


def _declared() -> dict[str, dict]:
    """protocol name -> its module (and, for one outside the package, its file and folder) and the
    spec's literal keywords (``takes_set``), read from the files without importing them: the
    package's modules, then those of :data:`PATH_ENV`'s folders (a protocol of your own: a module,
    its notebook beside it, a params file)."""
    extra = tuple(p for p in os.environ.get(PATH_ENV, "").split(os.pathsep) if p)
    return _scan(extra)


@lru_cache(maxsize=8)
def _scan(extra: tuple[str, ...]) -> dict[str, dict]:
    found = {}
    folders = [(_PACKAGE, True)] + [(Path(folder).expanduser().resolve(), False) for folder in extra]
    for folder, inside in folders:
        for path in sorted(folder.glob("*.py")):
            if path.name.startswith("_") or (inside and path.name == "spec.py"):
                continue
            text = path.read_text(encoding="utf-8")
            if "ProtocolSpec(" not in text:
                continue
            for node in ast.parse(text).body:
                if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SPEC" for t in node.targets)
                        and isinstance(node.value, ast.Call)):
                    literal = {k.arg: k.value.value for k in node.value.keywords if isinstance(k.value, ast.Constant)}
                    name = literal.get("name")
                    if not isinstance(name, str) or name in found:
                        continue
                    module = f"ddlib.protocols.{path.stem}" if inside else f"ddlib_protocol_{name}"
                    found[name] = {"module": module, "takes_set": literal.get("takes_set", True),
                                   "file": None if inside else str(path), "folder": None if inside else str(folder)}
    return found


def notebook_folder(name: str) -> Path | None:
    """Where a protocol's notebook is when it is not one of ddlib's (beside its module), else None."""
    folder = _declared()[name]["folder"]
    return Path(folder) if folder else None


def set_protocols() -> list[str]:
    """The protocols that score a set file (``ddlib score``), without importing one."""
    return [name for name, found in sorted(_declared().items()) if found["takes_set"]]


def protocol_names() -> list[str]:
    """Every protocol, without importing one."""
    return sorted(_declared())


def protocol_module(name: str):
    found = _declared().get(name)
    if found is None:
        raise ValueError(f"unknown protocol {name!r}; known: {protocol_names()}")
    if found["file"] is None:
        return importlib.import_module(found["module"])
    if found["module"] not in sys.modules:  # a protocol of your own: imported from its file, once
        loader = importlib.util.spec_from_file_location(found["module"], found["file"])
        module = importlib.util.module_from_spec(loader)
        sys.modules[found["module"]] = module
        loader.loader.exec_module(module)
    return sys.modules[found["module"]]


def get_spec(name: str) -> ProtocolSpec:
    """The protocol's spec (its module imported, and registered, on first use)."""
    if name not in REGISTRY:
        module = protocol_module(name)
        spec: ProtocolSpec = module.SPEC
        if spec.name != name:
            raise ValueError(f"{module.__name__}: SPEC names protocol {spec.name!r}, its file says {name!r}")
        object.__setattr__(spec, "module", module.__name__)
        REGISTRY.add(name, module.evaluate, defaults=spec.defaults(), spec=spec)
    return REGISTRY.entry(name).meta["spec"]


def all_specs() -> list[ProtocolSpec]:
    """Every protocol's spec, in report order."""
    return sorted((get_spec(name) for name in protocol_names()), key=lambda spec: (spec.order, spec.name))


def board_specs() -> dict[str, tuple[ProtocolSpec, Board]]:
    """Every leaderboard of every protocol: board name -> (its protocol, the board)."""
    return {board.name: (spec, board) for spec in all_specs() for board in spec.boards}


# --------------------------------------------------------------------------- notebooks

# every protocol's revision after the one that made the data row-major (a history entry of each spec)
LAYOUT_REVISION = ("tensors in row-major layout (ddlib.data.layout): on 1-channel data such as digits, whose loader "
                   "kept stride 1 on the channel axis, the convolutions round otherwise; 3-channel data as before")
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

