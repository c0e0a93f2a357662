"""The files a grid cell reads besides its dataset: a ``file`` source's set, a ``checkpoint`` source's
models (one per seed), a method preset, teacher checkpoints, a NAS ground-truth CSV.

Their content digests are part of the cell's keys (:func:`ddlib.protocols.cell.cell_tags`): a file
replaced at the same path is a new input, so its cells are computed again instead of skipped, and
its results never pool with the old file's. The batch runner checks every input of every cell
(:func:`check_inputs`) before anything runs, with the same functions the notebooks use, so a bad
file stops the grid with a message naming the file and the problem instead of failing one cell
after another (a teacher or a released model for another architecture is refused before any model
is trained).
"""

from __future__ import annotations

from pathlib import Path

from ddlib.data.digest import file_digest
from ddlib.methods.sources import load_file_source, source_path

__all__ = ["input_files", "input_digests", "check_inputs", "checkpoint_path"]


def input_files(params: dict) -> dict[str, list[Path]]:
    """The input files of a cell, by the parameter that names them (only those it has)."""
    from ddlib.protocols.presets import preset_file

    files: dict[str, list[Path]] = {}
    source = params.get("source") or {}
    if source.get("kind") == "file":
        files["source"] = [source_path(source, params["ipc"], params["dataset"])]
    elif source.get("kind") == "checkpoint":
        files["checkpoint"] = [Path(checkpoint_path(params, params["dataset"], seed)).expanduser()
                               for seed in params["seeds"]]
    if params.get("preset") is not None:
        try:
            files["preset"] = [preset_file(params["preset"])]
        except ValueError:
            files["preset"] = [Path(str(params["preset"]))]  # missing: validation says so
    if params.get("teacher_checkpoints"):
        files["teacher_checkpoints"] = [Path(c).expanduser() for c in params["teacher_checkpoints"]]
    if params.get("ground_truth"):
        files["ground_truth"] = [Path(params["ground_truth"]).expanduser()]
    return files


def checkpoint_path(params: dict, dataset_name: str, seed: int) -> str:
    """The file of one seed's model for a checkpoint source: ``{seed}``, ``{ipc}`` and ``{dataset}``
    filled in, every other character (braces included) taken literally."""
    path = params["source"]["path"]
    for name, value in (("seed", seed), ("ipc", params["ipc"]), ("dataset", dataset_name)):
        path = path.replace(f"{{{name}}}", str(value))
    return path


def input_digests(params: dict) -> dict[str, list[str]]:
    """Content digests of :func:`input_files` (``"missing"`` for a file that is not there); for a
    source that makes its set (random, kcenter, dm), what it runs where a revision is past 1
    (:func:`ddlib.methods.sources.builtin_revision`)."""
    from ddlib.methods.sources import builtin_revision

    digests = {key: [file_digest(path) for path in paths] for key, paths in input_files(params).items()}
    revision = builtin_revision(params.get("source") or {}) if "source" not in digests else None
    if revision:
        digests["source"] = [revision]
    return digests


def check_inputs(params: dict, run_code: bool = True) -> list[str]:
    """Load every input file of a validated cell as its notebook will, without training anything;
    a ``ValueError`` names the file and the problem. ``run_code=False`` (a dry run) does not load a
    set marked ``trusted: true`` where the safe loader refuses it (full unpickling runs the file's
    code): the returned notes say what it would load."""
    from ddlib.data.datasets import load_dataset
    from ddlib.data.distilled import needs_unpickling

    notes = []
    files = input_files(params)
    needs_data = bool({"source", "checkpoint", "teacher_checkpoints"} & set(files))
    dataset = load_dataset(params["dataset"], params.get("data_root")) if needs_data else None
    if "source" in files:
        path = files["source"][0]
        if not run_code and params["source"].get("trusted") and needs_unpickling(path):
            notes.append(f"{path}: not loaded (trusted: true, and only full unpickling reads it, which runs the "
                         "file's code); the run loads it")
        else:
            load_file_source(params["method"], params["source"], dataset, params["ipc"])
    if "checkpoint" in files:  # weights_only, and they must fit the cell's model and data
        from ddlib.protocols.teachers import load_teacher

        for path in files["checkpoint"]:
            load_teacher(params["model"], dataset, path, device="cpu")
    if "teacher_checkpoints" in files:
        _check_teachers(params, files["teacher_checkpoints"], dataset)
    if "ground_truth" in files:
        _check_ground_truth(params, files["ground_truth"][0])
    return notes


def set_leakage(params: dict) -> str | None:
    """A dry run's word on a cell's file set: the test images it holds (exact copies, near-duplicates:
    :mod:`ddlib.protocols.leakage`), or None (none, no file set, a ``trusted`` file only unpickling reads,
    or ZCA-whitened values: the run checks those once they are pixels). The run also checks the
    validation split, flags the cell, and in strict mode refuses it."""
    from ddlib.data.datasets import load_dataset
    from ddlib.data.distilled import needs_unpickling
    from ddlib.data.overlap import digests, find_overlap

    source = params.get("source") or {}
    if source.get("kind") != "file" or source.get("zca_space"):
        return None
    path = input_files(params)["source"][0]
    if source.get("trusted") and needs_unpickling(path):
        return None
    dataset = load_dataset(params["dataset"], params.get("data_root"))
    distilled = load_file_source(params["method"], source, dataset, params["ipc"])
    overlap = find_overlap(distilled.images, dataset.test_images, "test", set(digests(dataset.train_images)))
    if not overlap.leaked:
        return None
    return f"{path}: {overlap.summary()} of {dataset.label} ({overlap.pairs(4)})"


def _check_teachers(params: dict, checkpoints: list[Path], dataset) -> None:
    from ddlib.protocols.presets import load_preset
    from ddlib.protocols.teachers import load_teacher

    preset = load_preset(params["preset"]) if params.get("preset") is not None else None
    archs = preset.teacher_archs() if preset is not None else []
    if not archs:
        raise ValueError(f"teacher_checkpoints: {[str(c) for c in checkpoints]} given, but preset "
                         f"{params.get('preset')!r} relabels with no teachers")
    if len(archs) != len(checkpoints):
        raise ValueError(f"teacher_checkpoints: the preset has {len(archs)} teacher(s) {archs}, "
                         f"but {len(checkpoints)} checkpoint(s) were given")
    for arch, path in zip(archs, checkpoints):
        load_teacher(arch, dataset, path, device="cpu")


def _check_ground_truth(params: dict, path: Path) -> None:
    from ddlib.protocols.nas_space import sample_ground_truth

    sample_ground_truth(path, params["num_archs"], params["arch_seed"], column=params.get("gt_column"),
                        dataset=None if params.get("gt_column") else params["dataset"])
