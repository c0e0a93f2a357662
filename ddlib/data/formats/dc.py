"""DC / DSA / DM results (VICO-UoE/DatasetCondensation): a ``.pt`` dict whose ``data`` is a list of
``[images, labels]`` pairs, one per experiment (``experiment_index`` picks one; default the last), images
normalised with the dataset's mean/std; ``accs_all_exps`` goes into the provenance."""

from __future__ import annotations

from typing import Any

from ddlib.data.formats.base import DistilledSetError, SetPath, plain, set_format


def detect(src: SetPath) -> bool:
    """A ``.pt``/``.pth`` dict with ``data``: the DC / DSA / DM results layout."""
    if not src.is_torch_file():
        return False
    obj = src.torch_object()
    return isinstance(obj, dict) and "data" in obj


@set_format("dc", priority=20, detect=detect, detects="a DC .pt/.pth ('data')")
def read(src: SetPath) -> dict:
    """The ``experiment_index``-th ``[images, labels]`` pair of ``data`` (normalised images), its accuracies as provenance."""
    path, obj, experiment = src.path, src.torch_object(), src.experiment_index
    data = obj["data"]
    if not isinstance(data, (list, tuple)) or not data:
        raise DistilledSetError(f"{path}: 'data' must be a non-empty list of [images, labels] pairs")
    try:
        index = range(len(data))[experiment]
    except (IndexError, TypeError):
        raise DistilledSetError(
            f"{path}: experiment_index {experiment} out of range: the file holds {len(data)} experiment(s)"
        ) from None
    pair = data[index]
    if not isinstance(pair, (list, tuple)) or len(pair) < 2:
        raise DistilledSetError(f"{path}: data[{index}] must be an [images, labels] pair")
    provenance: dict[str, Any] = {"experiment_index": index, "num_experiments": len(data)}
    if "accs_all_exps" in obj:
        provenance["accs_all_exps"] = plain(obj["accs_all_exps"])
    return {
        "images": pair[0],
        "labels": pair[1],
        "default_normalized": True,
        "stem": path.stem,
        "provenance": provenance,
    }
