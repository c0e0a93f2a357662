"""A running cell's progress, per trained model, on the runner's console.

Cells run in papermill kernels whose output the runner does not show, so a cell says where it is
through a small file: the worker that executes a cell names it in ``DDLIB_PROGRESS_FILE`` (in the
runner's progress folder, or its own temporary folder on a Ray node); the cell's training loop
(:func:`ddlib.engine.train.train_and_test`'s ``on_epoch``) writes the model it trains (role, seeds,
learning rates), its epoch and the ETA of the call there, at most every ``DDLIB_PROGRESS_SECONDS``
(default 1) and whenever a model starts; the runner reads the files twice a second and shows one
line per running cell under its bar. The worker also mirrors the line to the cell run's
``ddlib.store.progress`` tag at most every :data:`TAG_SECONDS` (what ``ddlib runs`` shows, and what the
runner reads for cells on Ray nodes). Nothing here imports torch or MLflow.

The cell's own remaining time (``cell ~M:SS left``): the cell gives its writer the model of its work
(:meth:`ProgressWriter.plan`: its predicted seconds at the machine's calibrated rates, :mod:`ddlib.run.work`)
and, per training call, the predicted seconds of one model-epoch (``unit``). The writer adds up the
predicted seconds of what is done (trained epochs, and models found in the store) and scales what is
left by the cell's measured pace: remaining = (predicted total - predicted done) x seconds since the
cell opened / predicted seconds trained. A busy machine or a slow augmentation shows in it within
an epoch or two, whatever the dry run said.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

__all__ = ["FILE_ENV", "DIR_ENV", "PROGRESS_TAG", "TAG_SECONDS", "ProgressWriter", "read", "describe", "writer_from_env"]

FILE_ENV = "DDLIB_PROGRESS_FILE"  # where a cell writes its progress (set by the worker for the kernel)
DIR_ENV = "DDLIB_PROGRESS_DIR"  # the runner's folder of progress files (local executor)
PROGRESS_TAG = "ddlib.store.progress"  # a running cell's progress line on its run
TAG_SECONDS = float(os.environ.get("DDLIB_PROGRESS_TAG_SECONDS", "10"))  # the tag's writes: at most this often


def _every() -> float:
    return float(os.environ.get("DDLIB_PROGRESS_SECONDS", "1"))


class ProgressWriter:
    """Writes a cell's current training to ``path`` (JSON, replaced atomically), at most every
    ``every`` seconds, and always when a new model starts (epoch 0) or one ends."""

    def __init__(self, path: str | os.PathLike, cell: str, every: float | None = None):
        self.path, self.cell = Path(path), cell
        self.every = _every() if every is None else every
        self._last, self.started = 0.0, time.time()
        self.total: float | None = None  # the cell's predicted seconds of work (plan)
        self.done = 0.0  # predicted seconds of the calls finished, and of models found in the store
        self.trained = 0.0  # ... of the epochs trained here (what the pace is measured on)
        self._call = (0.0, None)  # the current call's predicted seconds done so far, and its last progress

    def plan(self, seconds: float | None) -> None:
        """The cell's work, in predicted seconds (None: not known here: no cell estimate is shown)."""
        self.total = seconds

    def skipped(self, seconds: float) -> None:
        """Predicted work the cell will not do (models found in the store)."""
        self.done += seconds

    def remaining(self) -> float | None:
        """Seconds the cell has left at its own pace so far (None before a first epoch, or without a plan)."""
        done = self.trained + self._call[0]
        if self.total is None or done <= 0:
            return None
        return max(0.0, self.total - self.done - done) * (time.time() - self.started) / done

    def __call__(self, role: str, progress, unit: float | None = None) -> None:
        """``progress``: an :class:`ddlib.engine.train.EpochProgress` of a call training ``role``;
        ``unit``: the predicted seconds of one of its model-epochs (the cell's estimate)."""
        if unit is not None:
            if progress.epoch == 0 and progress.models_before == 0:
                self.trained += self._call[0]  # a new call: the previous one is done
            self._call = ((progress.models_before * progress.epochs + len(progress.runs) * progress.epoch) * unit,
                          progress)
        now = time.monotonic()
        if progress.epoch not in (0, progress.epochs) and now - self._last < self.every:
            return
        self._last = now
        record = {"cell": self.cell, "role": role, "seeds": sorted({s for s, _ in progress.runs}),
                  "lrs": sorted({lr for _, lr in progress.runs}), "epoch": progress.epoch, "epochs": progress.epochs,
                  "model": progress.models_before + 1, "in_step": len(progress.runs), "models": progress.models,
                  "eta": progress.eta_seconds, "time": time.time(), "started": self.started,
                  "cell_eta": self.remaining()}
        self._write(record)


    def waiting(self, role: str, why: str) -> None:
        """Not training: ``role`` waits for ``why`` (another cell training the same models, say)."""
        self._write({"cell": self.cell, "role": role, "waiting": why, "time": time.time(), "started": self.started})

    def _write(self, record: dict) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            tmp.write_text(json.dumps(record))
            os.replace(tmp, self.path)
        except OSError:  # progress is advice: a full disk or a removed folder must not fail a training
            pass


def writer_from_env(cell: str) -> ProgressWriter | None:
    """The cell's progress writer when the runner named a progress file in the environment, else None."""
    path = os.environ.get(FILE_ENV)
    return ProgressWriter(path, cell) if path else None


def read(path: str | os.PathLike) -> dict | None:
    """A progress file's record, or None (not written yet, or being replaced)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _numbers(values: list, name: str) -> str:
    shown = ", ".join(f"{v:g}" for v in values[:6]) + (", ..." if len(values) > 6 else "")
    return f"{name}{'s' if len(values) > 1 else ''} {shown}"


def describe(record: dict) -> str:
    """One line: ``syn_hard · seed 0 · lr 0.01 · model 2/6 · epoch 120/300 · ETA 0:42`` (the ETA of
    the role's models, at the pace of the current one)."""
    if record.get("waiting"):
        return f"{record['role']} · {record['waiting']}"
    first, models, step = record["model"], record["models"], record.get("in_step", 1)
    parts = [record["role"], _numbers(record["seeds"], "seed"), _numbers(record["lrs"], "lr")]
    if models > 1:  # the call's models: a role's seeds, an lr search's candidates
        parts.append(f"model {first}/{models}" if step == 1 else f"models {first}-{first + step - 1}/{models}")
    parts.append(f"epoch {record['epoch']}/{record['epochs']}")
    if record.get("eta") is not None:
        parts.append(f"ETA {_clock(record['eta'])}")
    if record.get("cell_eta") is not None:
        parts.append(f"cell ~{_clock(record['cell_eta'])} left")
    return " · ".join(parts)
