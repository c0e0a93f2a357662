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
