"""Released models (``source: {kind: checkpoint, path, model}``, e.g. BEARD's model pool): the clean
accuracy a released model must reach on the cell's data (its file per seed:
:func:`ddlib.protocols.inputs.checkpoint_path`).

The load check sees only shapes: BACON's weights load into a ConvNet with ``GroupNorm`` or max
pooling (25.7 % and 64.0 % clean) as well as into the right one (67.0 %; ddlib measures 68.63 % on
CIFAR-10 (JPEG)). So the clean accuracy is compared with ``expected_accuracy`` (given in %, like
every accuracy ddlib shows, or the ``_0.6995`` that ends BEARD's file names) within
``accuracy_tolerance`` (points); beyond it the cell fails, naming the file and both figures. A file
whose name carries no accuracy (BEARD's own ``DC_ConvNet_CIFAR10_50_None.pth``, ``DM_...``) is
refused before anything runs unless the source gives ``expected_accuracy``, a figure or
``unknown`` (then the cell is only flagged): BEARD's Table 18 gives 54.31 for its DC and 62.06 for
its DM model (:data:`BEARD_POOL_ACCURACY`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ddlib.protocols.cell import Cell, TrainedModel

__all__ = ["expected_accuracy", "check_expected_accuracy", "check_checkpoint_accuracy", "DEFAULT_ACCURACY_TOLERANCE",
           "UNKNOWN", "BEARD_POOL_ACCURACY"]


DEFAULT_ACCURACY_TOLERANCE = 0.04  # a fraction (the key is in points: 4); BEARD's BACON: 69.95 % on CIFAR-10, 68.63 % on JPEG
_ACCURACY_IN_NAME = re.compile(r"_(0\.\d{2,})$")  # BEARD's model pool: BACON_ConvNet_CIFAR10_50_None_0.6995.pth
UNKNOWN = "unknown"  # expected_accuracy: unknown: attack a model whose accuracy nobody published (flagged)
# BEARD's Table 18 (CIFAR-10, ConvNet, IPC 50), in %: its released models whose file names carry no accuracy
BEARD_POOL_ACCURACY = {"DC": 54.31, "DM": 62.06}


def expected_accuracy(source: dict, path: str) -> tuple[float | None, str]:
    """The clean accuracy (a fraction) a checkpoint must reach, and where that figure comes from;
    None for ``expected_accuracy: unknown`` or a file name without one."""
    given = source.get("expected_accuracy")
    if given == UNKNOWN:
        return None, ""
    if given is not None:
        return float(given) / 100, "expected_accuracy"
    match = _ACCURACY_IN_NAME.search(Path(path).stem)
    return (float(match[1]), "its file name") if match else (None, "")


def check_checkpoint_accuracy(method: str, source: dict) -> None:
    """Before anything runs: ``expected_accuracy`` is a percentage in (1, 100] or ``unknown``, and is
    given where the file name carries no accuracy (the load check sees only shapes: a mis-built
    variant would load and be attacked); ``accuracy_tolerance`` is in points, in [0, 100]."""
    value, name = source.get("expected_accuracy"), Path(source["path"]).name
    if value is None and _ACCURACY_IN_NAME.search(Path(source["path"]).stem) is None:
        raise ValueError(f"method {method!r}: {name} carries no accuracy in its name (BEARD's _0.6995) and the source "
                         "has no expected_accuracy: give it in % (BEARD's Table 18: 54.31 for its DC, 62.06 for its DM "
                         "model) or expected_accuracy: unknown (the load check sees only shapes)")
    if isinstance(value, str) and value != UNKNOWN:
        raise ValueError(f"method {method!r}: expected_accuracy must be a number in % or {UNKNOWN!r}, got {value!r}")
    if isinstance(value, (int, float)) and not 1 < value <= 100:
        raise ValueError(f"method {method!r}: expected_accuracy is in % like every accuracy ddlib shows (69.95 for "
                         f"69.95 %), in (1, 100], got {value!r}" + (" (a fraction? times 100)" if 0 < value <= 1 else ""))
    tolerance = source.get("accuracy_tolerance")
    if tolerance is not None and not 0 <= tolerance <= 100:
        raise ValueError(f"method {method!r}: accuracy_tolerance is in points (4 for 4 points), in [0, 100], "
                         f"got {tolerance!r}")


def check_expected_accuracy(cell: Cell, models: list[TrainedModel], paths: dict[int, str]) -> None:
    """Fail a cell whose released model misses its expected clean accuracy by more than the
    tolerance (the load check sees only shapes); flag one with no expectation that scores near chance."""
    from ddlib.protocols.teachers import CheckpointError

    source, ds = cell.params["source"], cell.dataset
    given = source.get("accuracy_tolerance")
    tolerance = DEFAULT_ACCURACY_TOLERANCE if given is None else given / 100
    for model in models:
        path = paths[model.seed]
        expected, origin = expected_accuracy(source, path)
        if expected is None:
            near = model.accuracy <= 1.5 / ds.num_classes
            cell.flag(f"{Path(path).name}: clean accuracy {100 * model.accuracy:.1f} % "
                      + (f"is near chance for {ds.num_classes} classes (untrained, or trained on other data or "
                         "normalisation?)" if near else "was checked against no expected accuracy (the load check sees "
                                                        "only shapes)") + "; give expected_accuracy (in %) to check it")
            continue
        gap = model.accuracy - expected
        if abs(gap) > tolerance:
            raise CheckpointError(
                f"{path}: clean accuracy {100 * model.accuracy:.2f} % on {ds.label}, but "
                f"{100 * expected:.2f} % is expected ({origin}; tolerance {100 * tolerance:g} points): the weights "
                f"load into {cell.params['model']!r} but are not the model they claim to be (another architecture "
                "variant, normalisation or dataset?)")
        cell.tracker.set_tags(cell.run_id, {f"ddlib.checkpoint_accuracy.seed{model.seed}":
                                            f"{100 * model.accuracy:.2f} % against {100 * expected:.2f} % "
                                            f"expected ({origin}), within {100 * tolerance:g} points"})


def pool_checkpoints(cell: Cell, role: str, paths: dict[int, str], model: str,
                     model_kwargs: dict | None = None) -> list[TrainedModel]:
    """Released weights (one state_dict file per seed) into the model pool, like trained models.

    Each file is loaded with ``weights_only=True`` into the registry's ``model`` for this
    cell's data (:func:`ddlib.protocols.teachers.load_teacher`: an unreadable file, or weights
    that do not fit the architecture, the channels, image size or class count, raise
    ``CheckpointError`` naming the file). The weights are keyed by their content: the first
    time, the model is scored on the test set and stored as an evaluation run (params
    ``checkpoint``, ``weights_digest``); later, in any cell or process, that run is found again,
    so results cached against it (attacks) are reused."""
    import time

    from ddlib.data.digest import tensor_digest
    from ddlib.engine.test_pass import Normalize, model_accuracy
    from ddlib.protocols.cell import MODEL_STORED_TAG, TrainedModel
    from ddlib.protocols.teachers import CheckpointError, load_teacher
    from ddlib.store.hashing import config_hash
    from ddlib.store.locks import file_lock
    from ddlib.store.provenance import default_tags
    from ddlib.store.tags import TAG
    from ddlib.store.tracking import as_stored, run_metrics

    ds = cell.dataset
    test = cell.scored_on("test")
    found, digests = [], {}
    with cell.guard():
        for seed, path in paths.items():
            if not Path(path).is_file():
                raise CheckpointError(f"{path}: no such checkpoint file (seed {seed})")
            net = load_teacher(model, ds, path, device=cell.device, model_kwargs=model_kwargs)
            digest = tensor_digest(*net.state_dict().values())
            if digest in digests:
                raise CheckpointError(f"{path}: the same weights as seed {digests[digest]}'s checkpoint; "
                                      "each seed must be another model (or list one seed)")
            digests[digest] = seed
            identity = {"checkpoint": digest, "model": model, "model_kwargs": model_kwargs or {}, "test": test,
                        "definition": cell.definition()}
            key = config_hash(identity)
            with file_lock(f"eval-{key}"):
                runs = cell.tracker.find_finished({TAG["eval_key"]: key, MODEL_STORED_TAG: "true"})
                if runs:
                    m = run_metrics(runs[0])
                    found.append(TrainedModel(role, seed, m["test_accuracy"], float("nan"),
                                            m.get("eval_seconds", float("nan")), runs[0].info.run_id, True, net))
                    continue
                start = time.perf_counter()
                accuracy = model_accuracy(net, ds.test_images, ds.test_labels, Normalize(ds.mean, ds.std).to(cell.device))
                seconds = time.perf_counter() - start
                run_id = cell.tracker.start_run(
                    f"{role}-seed{seed}",
                    params={"role": role, "seed": seed, "model": model, "model_kwargs": model_kwargs or {},
                            "checkpoint": str(path), "weights_digest": digest, "eval_split": "test",
                            "dataset": ds.name},
                    tags={**default_tags(cell.protocol, str(cell.device)), TAG["kind"]: "eval",
                          TAG["role"]: role, TAG["eval_key"]: key},
                    parent_run_id=cell.run_id)
                cell._store_model(run_id, net)
                cell.tracker.log_metrics(run_id, {"test_accuracy": accuracy, "eval_seconds": seconds})
                cell.tracker.end_run(run_id)
                accuracy = as_stored({"test_accuracy": accuracy})["test_accuracy"]  # as a reuse reads it
                found.append(TrainedModel(role, seed, accuracy, float("nan"), seconds, run_id, False, net))
    return found
