"""What would run a protocol for one set (method x dataset x IPC): the command a report card gives where
the protocol has not run (``ddlib score``, a shipped grid or the notebook under papermill)."""

from __future__ import annotations

import json
import shlex

from ddlib.boards.read import reading_from
from ddlib.protocols import PROTOCOLS
from ddlib.protocols.common import FULL_IPC
from ddlib.protocols.spec import set_protocols
from ddlib.specs.yamlfile import YamlFileError, load_yaml
from ddlib.store.paths import PROJECT_ROOT

__all__ = ["run_command", "data_label", "SET_PROTOCOLS"]

SET_PROTOCOLS = tuple(set_protocols())  # what `ddlib score` runs on a set file


def run_command(protocol: str, method: str, dataset: str, ipc: int, source: dict | None = None,
                seeds: list[int] | None = None, config: dict | None = None) -> str:
    """The command that fills this protocol for this set: for a set file, ``ddlib score`` with the
    protocol, the seeds, preset, data root and recipe its other protocols ran with (``config``: one
    of their resolved configs); else a repository params file that names the method on this dataset,
    else the protocol's notebook under papermill with the set's params."""
    if source and source.get("kind") == "file" and source.get("path") and protocol in SET_PROTOCOLS:
        return _score_command(protocol, method, dataset, source, seeds, config or {})
    root = PROJECT_ROOT / "params"
    # a shipped grid files its cells in the protocol's own experiment: not where --experiment reads
    for path in sorted(root.glob("*.yaml")) if root.is_dir() and not reading_from() else []:
        try:
            raw = load_yaml(path) or {}  # the one reader of params files (bounded, checked)
        except (OSError, YamlFileError):
            continue
        if not isinstance(raw, dict) or raw.get("protocol") != protocol:
            continue
        params = raw.get("params") or {}
        grids = raw.get("grid") or {}
        grids = grids if isinstance(grids, list) else [grids]
        for grid in grids:
            if not isinstance(grid, dict):
                continue
            methods = grid.get("method", [params.get("method")])
            datasets = grid.get("dataset", [params.get("dataset", "digits")])
            ipcs = grid.get("ipc", [params.get("ipc", 1)])
            if method in methods and dataset in datasets and (ipc in ipcs or method == "full"):
                return f"python -m ddlib run params/{path.name}"
    notebook = PROTOCOLS[protocol][0]
    args = ["papermill", f"notebooks/{notebook}", f"{protocol}-{method}-ipc{ipc}.ipynb", "-p", "dataset", dataset,
            "-p", "method", method]
    if ipc != FULL_IPC:
        args += ["-p", "ipc", str(ipc)]
    if reading_from():
        args += ["-p", "experiment", reading_from()]
    from ddlib.methods.sources import BUILTIN_SOURCES

    extra = {}
    if source and BUILTIN_SOURCES.get(method) != source:
        extra["source"] = source
    if seeds:
        extra["seeds"] = list(seeds)
    if extra:
        args += ["-y", json.dumps(extra)]
    if protocol == "nas":
        args += ["-p", "ground_truth", "PATH/TO/nasbench201-accuracy.csv"]
    return " ".join(shlex.quote(a) for a in args)


def _score_command(protocol: str, method: str, dataset: str, source: dict, seeds, config: dict) -> str:
    """``ddlib score`` of a set file under ``protocol``, with what its other cells ran with."""
    args = ["python", "-m", "ddlib", "score", str(source["path"]), "--dataset", dataset, "--protocol", protocol,
            "--method", method]
    if seeds:
        args += ["--seeds", *(str(s) for s in seeds)]
    for key, flag in (("preset", "--preset"), ("data_root", "--data-root")):
        if config.get(key) not in (None, ""):
            args += [flag, str(config[key])]
    for key, flag in (("experiment_index", "--experiment-index"),):
        if source.get(key) is not None:
            args += [flag, str(source[key])]
    for key in ("normalized", "zca_space"):
        if source.get(key) is not None:
            args.append(f"--{'' if source[key] else 'no-'}{key.replace('_', '-')}")
    if isinstance(config.get("recipe"), dict) and config["recipe"]:
        args += ["--param", "recipe=" + json.dumps(config["recipe"], separators=(", ", ": "))]
    return shlex.join(args)


def data_label(dataset: str, source: str) -> str:
    """How the data is named in a report, for runs without the ``ddlib.data`` tag (cells tag it from
    :attr:`ddlib.data.datasets.Dataset.label`): the shared CIFAR-10 is a JPEG re-encoding."""
    if dataset == "cifar10" and "jpeg" in (source or "").lower():
        return "CIFAR-10 (JPEG)"
    return dataset
