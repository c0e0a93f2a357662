"""What every set format shares: the registry (:data:`FORMATS`), the :class:`SetPath` a reader is
handed, the error type, and safe ``torch.load``.

A format is a reader registered with :func:`set_format`: its name (``provenance["format"]``), what
it reads (one phrase, shown when no format reads a path), a ``detect(src) -> bool`` and a priority.
:func:`ddlib.data.formats.read` asks each format in priority order (lowest first; a new format's
default, 0, comes before the built-ins) and the first whose ``detect`` says yes reads the set. A
reader returns a dict: ``images``, ``labels``, optionally ``soft_labels``, ``lr``, ``normalized``,
``zca_space``, ``method``, ``provenance``, plus ``default_normalized`` (whether the format stores
normalised images) and ``stem`` (the default method name).

Security: ``.pt`` files are read with ``torch.load(weights_only=True)``, which unpickles only
tensors, containers and primitive values, plus the numpy scalars and arrays DC-format files hold
(:data:`NUMPY_SAFE_GLOBALS`, allow-listed); anything else needs full unpickling, which can run
arbitrary code and happens only with ``trusted=True``.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from ddlib.specs.registry import Entry, Registry

if TYPE_CHECKING:
    from ddlib.data.datasets import Dataset

__all__ = ["FORMATS", "SetPath", "set_format", "formats", "DistilledSetError", "NUMPY_SAFE_GLOBALS", "torch_load",
           "require_keys", "flag", "plain", "short"]

FORMATS: Registry = Registry("set format")


class DistilledSetError(ValueError):
    """A distilled set is unreadable or inconsistent; the message starts with the file's path."""


def set_format(name: str, *, detects: str, detect: Callable[["SetPath"], bool], priority: int = 0,
               files: Callable[[Path], "list[Path] | None"] | None = None) -> Callable:
    """Decorator: register ``read(src: SetPath) -> dict`` as the set format ``name``, which reads what
    ``detect(src)`` accepts. ``detects``: what it reads, one phrase ("a .npz file with ..."). ``priority``:
    lower is asked first (built-ins: 10-50). ``files(path)``: the ``.pt`` files it would load for
    ``path`` when these are not just ``path`` (a dry run asks whether any needs unpickling)."""
    return FORMATS.register(name, detects=detects, detect=detect, priority=priority, files=files)


def formats() -> list[Entry]:
    """The registered formats in the order they are asked (priority, then name)."""
    return sorted((FORMATS.entry(n) for n in FORMATS), key=lambda e: (e.meta["priority"], e.name))


@dataclass
class SetPath:
    """A path to read a set from, with what the caller passed: the dataset it is checked against,
    a DC file's experiment, and whether full unpickling is allowed. :meth:`torch_object` loads a
    ``.pt`` file once, however many formats look at its contents."""

    path: Path
    dataset: "Dataset | None" = None
    experiment_index: int = -1
    trusted: bool = False
    _loaded: list = field(default_factory=list, repr=False)

    @property
    def suffix(self) -> str:
        """The file's suffix, lower-cased, so ``.PT`` and ``.pt`` are read alike."""
        return self.path.suffix.lower()

    def is_torch_file(self) -> bool:
        """An existing ``.pt``/``.pth`` file: what the torch formats' ``detect`` first asks."""
        return self.path.is_file() and self.suffix in (".pt", ".pth")

    def torch_object(self) -> Any:
        """The object in the ``.pt`` file (safe loader; full unpickling only if ``trusted``)."""
        if not self._loaded:
            self._loaded.append(torch_load(self.path, self.trusted)[0])
        return self._loaded[0]


# --------------------------------------------------------------------------- torch.load

# What weights_only unpickling may build beyond tensors and primitives: numpy scalars and arrays
# (DC-format files keep their accuracies as numpy.float64, some as arrays). These only rebuild numpy
# values from bytes and already-safe objects; they call nothing else. numpy 2 moved them to
# numpy._core; files written with numpy 1 name them numpy.core.multiarray.*.
_MULTIARRAY = np._core.multiarray
NUMPY_SAFE_GLOBALS = [
    _MULTIARRAY.scalar, (_MULTIARRAY.scalar, "numpy.core.multiarray.scalar"),
    _MULTIARRAY._reconstruct, (_MULTIARRAY._reconstruct, "numpy.core.multiarray._reconstruct"), np.ndarray, np.dtype,
    *(getattr(np.dtypes, name) for name in (
        "BoolDType", "Int8DType", "Int16DType", "Int32DType", "Int64DType", "UInt8DType", "UInt16DType",
        "UInt32DType", "UInt64DType", "Float16DType", "Float32DType", "Float64DType", "LongLongDType",
        "ULongLongDType", "LongDType", "ULongDType") if hasattr(np.dtypes, name)),
]


def torch_load(path: Path, trusted: bool = False) -> tuple[Any, bool]:
    """``torch.load`` with ``weights_only=True`` (numpy scalars allow-listed); full unpickling only
    when the file needs it and ``trusted``. Returns the object and whether the safe loader sufficed."""
    try:
        with torch.serialization.safe_globals(NUMPY_SAFE_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True), True
    except pickle.UnpicklingError as exc:
        refusal = exc  # holds objects the safe loader does not build
    except Exception as exc:
        raise DistilledSetError(f"{path}: unreadable or corrupt file ({type(exc).__name__}: {short(exc)})") from exc
    if not trusted:
        try:
            needs = ", ".join(torch.serialization.get_unsafe_globals_in_checkpoint(path)) or short(refusal)
        except Exception:  # noqa: BLE001 - only for the message
            needs = short(refusal)
        raise DistilledSetError(
            f"{path}: refused to unpickle: the file holds Python objects that loading with weights_only=True does "
            f"not build ({needs}), and full unpickling can run arbitrary code. If you trust the file, set "
            "`trusted: true` in its source spec (methods: {name: {kind: file, path: ..., trusted: true}}) or pass "
            "trusted=True to ddlib.data.distilled.load; or re-save it with ddlib.data.distilled.save"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=False), False
    except Exception as exc:
        raise DistilledSetError(f"{path}: unreadable or corrupt file ({type(exc).__name__}: {short(exc)})") from exc


# --------------------------------------------------------------------------- helpers readers share


def require_keys(path: Path, obj: dict, keys: tuple[str, ...]) -> None:
    """Refuse a set file's dict that lacks one of ``keys``, naming the missing keys and those it holds."""
    missing = [k for k in keys if k not in obj]
    if missing:
        raise DistilledSetError(f"{path}: missing keys {missing}; found {sorted(map(str, obj))}")


def set_fields(path: Path, values: dict) -> dict:
    """What a file of named arrays holds (a plain ``.pt`` dict, an ``.npz``): images and labels
    (required), soft labels, a learned lr and the flags, read as a format's reader returns them."""
    require_keys(path, values, ("images", "labels"))
    return {"images": values["images"], "labels": values["labels"], "soft_labels": values.get("soft_labels"),
            "lr": values.get("lr"), "normalized": flag(values.get("normalized"), path, "normalized"),
            "zca_space": flag(values.get("zca_space"), path, "zca_space"), "default_normalized": False,
            "stem": path.stem}


def flag(value: Any, path: Path, key: str) -> bool | None:
    """A flag stored in a file: a boolean (or 0/1), else refused. ``bool("False")`` is true, so a
    string flag read loosely would de-normalise pixels that were never normalised."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        if value.size != 1:
            raise DistilledSetError(f"{path}: {key} must be true or false (a boolean), got an array of shape "
                                    f"{value.shape}")
        value = value.reshape(-1)[0]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    shown = repr(value.item() if isinstance(value, np.generic) else value)
    raise DistilledSetError(f"{path}: {key} must be true or false (a boolean), got {shown[:60]}"
                            f"{' (a string)' if isinstance(value, (str, np.str_)) else ''}")


def plain(value: Any) -> Any:
    """Numpy / torch values -> plain Python, so provenance logs to MLflow and saves without pickle."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return plain(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    return value


def short(exc: Exception, limit: int = 200) -> str:
    """An exception's message on one line of at most ``limit`` characters, for a one-line error that wraps it."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
