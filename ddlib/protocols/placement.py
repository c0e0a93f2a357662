"""Where a cell belongs: its keys (the config a rerun skips by, its leaderboard row, that row across
IPCs, the rows it is compared with) and its run name. The keys hash the cell's parameters in the
protocol's canonical form, the protocol's and the engine's revisions (:mod:`ddlib.specs.keys`), the content
of the cell's real data (not where it lies: ``data_root``) and of its input files."""

from __future__ import annotations

from ddlib.specs.keys import ENGINE_REVISION, LATER_PARAM_DEFAULTS, without_later_defaults
from ddlib.methods.sources import RENAMED_KEYS
from ddlib.protocols.inputs import input_digests
from ddlib.store.hashing import config_hash
from ddlib.store.tags import TAG

__all__ = ["NON_GROUP_PARAMS", "group_params", "cell_tags", "run_name"]

# Params that do not change what a leaderboard row means (seeds are pooled across runs; the data's
# location is not its identity: the same grid run from another checkout fills the same rows).
NON_GROUP_PARAMS = ("seeds", "device", "run_id", "experiment", "data_root")


def _as_stored(params: dict) -> dict:
    """Params that joined after cells were stored are left out of every key at their first defaults
    (:mod:`ddlib.specs.keys`), and a source key renamed since keeps its old name in them
    (:data:`ddlib.methods.sources.RENAMED_KEYS`), so the cells stored before keep their config, group,
    series and family."""
    params = without_later_defaults(params, LATER_PARAM_DEFAULTS)
    source = params.get("source")
    if isinstance(source, dict) and (renamed := RENAMED_KEYS.get(source.get("kind"))):
        old_name = {new: old for old, new in renamed.items()}
        params = {**params, "source": {old_name.get(k, k): v for k, v in source.items()}}
    return params


def group_params(params: dict, protocol: str | None = None) -> dict:
    """What a leaderboard row means: the params without those of ``NON_GROUP_PARAMS``, in the
    protocol's canonical form (its module's ``group_identity(params)``, where it has one: e.g.
    attacks spelled two ways, or a score weight the summary recomputes anyway, are one row)."""
    out = {k: v for k, v in _as_stored(params).items() if k not in NON_GROUP_PARAMS}
    if protocol is not None:
        from ddlib.protocols import PROTOCOLS, protocol_module

        if protocol in PROTOCOLS and hasattr(module := protocol_module(protocol), "group_identity"):
            out = module.group_identity(out)
    return out


def cell_tags(protocol: str, params: dict) -> dict[str, str]:
    """The tags that place a cell run: its full config (reruns skip it), its leaderboard row
    (``group``), that row across IPCs (``series``) and the rows it is compared with (``family``:
    the same setting for every method)."""
    from ddlib.protocols import PROTOCOLS, protocol_revision

    raw = _as_stored(params)
    params = _identity(raw)
    group = group_params(params, protocol)
    series = {k: v for k, v in group.items() if k != "ipc"}
    family = {k: v for k, v in series.items() if k not in ("method", "source")}
    # The protocol's revision is part of every key: a row never pools cells computed under two
    # definitions, and a rerun after a definition change recomputes instead of skipping.
    # So are the engine's revision and the content of the real data (PNG in place of JPEG at the same
    # data_root is other data).
    head = {"protocol": protocol, "revision": protocol_revision(protocol) if protocol in PROTOCOLS else 0,
            "engine": ENGINE_REVISION, "data": _data_content(raw)}
    # So is the content of every input file (a set replaced at the same path is a new input).
    digests = input_digests(raw)
    inputs = {"inputs": digests} if digests else {}
    shared = {k: v for k, v in digests.items() if k != "source"}  # what every method of a family reads
    return {
        TAG["kind"]: "cell",
        TAG["revision"]: str(head["revision"]),
        TAG["engine_revision"]: str(ENGINE_REVISION),
        TAG["config"]: config_hash({**head, **params, **inputs}),
        TAG["group"]: config_hash({**head, **group, **inputs}),
        TAG["series"]: config_hash({**head, **series, **inputs}),
        TAG["family"]: config_hash({**head, **family, **({"inputs": shared} if shared else {})}),
    }


def _data_content(params: dict) -> dict | str:
    """The content of the cell's real data (:func:`ddlib.data.digest.data_identity`: its training and
    test images and labels, normalisation and classes; loaded once per process and digested once per
    dataset), or ``"unavailable"`` where it cannot be loaded (such a cell fails when it runs)."""
    from ddlib.data.datasets import DatasetError, load_dataset
    from ddlib.data.digest import data_identity

    if not params.get("dataset"):
        return "none"
    try:
        return data_identity(load_dataset(params["dataset"], params.get("data_root")))
    except (DatasetError, OSError, ValueError):
        return "unavailable"


def _identity(params: dict) -> dict:
    """The params as a cell's keys see them: a file's or checkpoint's path is a label, its content
    (the input digests, beside) is its identity, so one set reached by two paths is one cell and one
    row, and another file at the same path is another."""
    source = params.get("source")
    if isinstance(source, dict) and source.get("kind") in ("file", "checkpoint") and "path" in source:
        path = source["path"]
        placeholders = [p for p in ("{ipc}", "{dataset}", "{seed}") if p in path]
        source = {k: v for k, v in source.items() if k != "path"}
        if placeholders:  # what varies with the cell stays part of its identity
            source["path_placeholders"] = placeholders
        params = {**params, "source": source}
    return params


def run_name(protocol: str, params: dict) -> str:
    """A cell's readable run name: method, IPC and model (``dm-ipc10-convnet``; ``full-convnet`` for
    the whole training set), then what else tells two cells of one experiment apart at a glance (the
    attack mode). The dataset and everything else are params: columns of the MLflow UI's table."""
    parts = [str(params.get("method") or protocol)]
    if params.get("ipc"):  # 0: the whole training set (method full)
        parts.append(f"ipc{params['ipc']}")
    parts.append(str(params.get("model") or ("nas201" if protocol == "nas" else "")))
    if params.get("mode"):
        parts.append(str(params["mode"]))
    return "-".join(p for p in parts if p)
