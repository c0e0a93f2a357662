"""The plain ``.pt`` dict ``{images, labels[, soft_labels][, lr][, normalized][, zca_space][, method][,
provenance]}``, the format :func:`ddlib.data.distilled.save` writes; pixels unless ``normalized``.
Asked after the DC format, it reads every other ``.pt``/``.pth`` file, so a file that holds neither
layout is refused here, naming what it holds."""

from __future__ import annotations

from ddlib.data.formats.base import DistilledSetError, SetPath, plain, set_fields, set_format


@set_format("pt", priority=30, detect=SetPath.is_torch_file,
            detects="a .pt/.pth with 'images' and 'labels'")
def read(src: SetPath) -> dict:
    """The named tensors of a ``.pt`` dict (:func:`ddlib.data.distilled.save`'s format), with its method and provenance."""
    path, obj = src.path, src.torch_object()
    if not isinstance(obj, dict):
        raise DistilledSetError(
            f"{path}: unknown format: file holds a {type(obj).__name__}, expected a dict "
            "(DC 'data' list, or 'images' and 'labels')"
        )
    if "images" not in obj and "labels" not in obj:
        raise DistilledSetError(
            f"{path}: unknown format: dict with keys {sorted(map(str, obj))}; expected 'data' (DC/DSA/DM results) "
            "or 'images' and 'labels'"
        )
    provenance = obj.get("provenance")
    return {**set_fields(path, obj), "method": obj.get("method") or None,
            "provenance": plain(provenance) if isinstance(provenance, dict) else None}
