"""Released models (``source: {kind: checkpoint, path, model}``, e.g. BEARD's model pool): the clean
accuracy a released model must reach on the cell's data (its file per seed:
:func:`ddlib.protocols.inputs.checkpoint_path`).

The load check sees only shapes: BACON's weights load into a ConvNet with ``GroupNorm`` or max
pooling (25.7 % and 64.0 % clean) as well as into the right one (67.0 %; ddlib measures 68.63 % on
CIFAR-10 (JPEG)). So the clean accuracy is compared with ``expected_accuracy`` (given, or the
``_0.6995`` that ends BEARD's file names) within ``accuracy_tolerance``; beyond it the cell fails,
naming the file and both figures.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ddlib.protocols.cell import Cell, TrainedModel

__all__ = ["expected_accuracy", "check_expected_accuracy", "DEFAULT_ACCURACY_TOLERANCE"]


DEFAULT_ACCURACY_TOLERANCE = 0.04  # BEARD's BACON ConvNet: 69.95 % on CIFAR-10, 68.63 % on CIFAR-10 (JPEG)
_ACCURACY_IN_NAME = re.compile(r"_(0\.\d{2,})$")  # BEARD's model pool: BACON_ConvNet_CIFAR10_50_None_0.6995.pth


def expected_accuracy(source: dict, path: str) -> tuple[float | None, str]:
    """The clean accuracy a checkpoint must reach, and where that figure comes from."""
    if source.get("expected_accuracy") is not None:
        return float(source["expected_accuracy"]), "expected_accuracy"
    match = _ACCURACY_IN_NAME.search(Path(path).stem)
    return (float(match[1]), "its file name") if match else (None, "")


def check_expected_accuracy(cell: Cell, models: list[TrainedModel], paths: dict[int, str]) -> None:
    """Fail a cell whose released model misses its expected clean accuracy by more than the
    tolerance (the load check sees only shapes); flag one with no expectation that scores near chance."""
    from ddlib.protocols.teachers import CheckpointError

    source, ds = cell.params["source"], cell.dataset
    tolerance = source.get("accuracy_tolerance", DEFAULT_ACCURACY_TOLERANCE)
    for model in models:
        path = paths[model.seed]
        expected, origin = expected_accuracy(source, path)
        if expected is None:
            near = model.accuracy <= 1.5 / ds.num_classes
            cell.flag(f"{Path(path).name}: clean accuracy {100 * model.accuracy:.1f} % "
                      + (f"is near chance for {ds.num_classes} classes (untrained, or trained on other data or "
                         "normalisation?)" if near else "was checked against no expected accuracy (the load check sees "
                                                        "only shapes)") + "; give expected_accuracy to check it")
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

    import ddlib
    from ddlib.data.digest import tensor_digest
    from ddlib.engine.test_pass import Normalize, model_accuracy
    from ddlib.protocols.cell import MODEL_STORED_TAG, TrainedModel
    from ddlib.protocols.teachers import CheckpointError, load_teacher
    from ddlib.tracking import TAG, as_stored, config_hash, default_tags, file_lock, run_metrics

    ds = cell.dataset
    test = f"{ds.name}:{ds.source}:test:{tensor_digest(ds.test_labels)}"
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
                        "version": ddlib.__version__}
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
