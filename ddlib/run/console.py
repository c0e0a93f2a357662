"""The runner's console: a line per running cell under the grid's bar (the model it trains, its
epoch and ETA, its minutes against the runner's estimate), read from the progress files its kernels
write on this machine (:mod:`ddlib.store.progress`) or from the runs' progress tags (Ray)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from tqdm.auto import tqdm

from ddlib.store import progress as cell_progress
from ddlib.store.tags import TAG
from ddlib.store.tracking import Tracker

__all__ = ["CellLines", "progress_files", "progress_tags", "PROGRESS_POLL_SECONDS", "PLAIN_PROGRESS_SECONDS"]

PROGRESS_POLL_SECONDS = 0.5
PLAIN_PROGRESS_SECONDS = 30.0  # not a terminal: a running cell's line at most this often (and on a new model)


class CellLines:
    """One line per running cell under the grid's bar: the model it trains now, its epoch and ETA
    (:mod:`ddlib.store.progress`), refreshed by a thread every :data:`PROGRESS_POLL_SECONDS`."""

    def __init__(self, slots: int, source, disable: bool, terminal: bool | None = None):
        self.source, self.disable = source, disable  # source() -> {cell name: line}
        # Not a terminal (a log file, CI): no redrawn lines (each redraw would be a new line of the
        # log), but a cell's line printed when it starts training another model or every
        # PLAIN_PROGRESS_SECONDS.
        self.terminal = sys.stderr.isatty() if terminal is None else terminal
        self.bars = [tqdm(total=0, position=i + 1, bar_format="{desc}", leave=False, dynamic_ncols=True,
                          disable=disable or not self.terminal) for i in range(slots)]
        self._printed: dict[str, tuple[str, float]] = {}  # cell -> (what it trained, when) last printed
        self.names: list[str | None] = [None] * slots
        self.done: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True, name="ddlib-progress")

    def start(self) -> None:
        if not self.disable and self.bars:
            self._thread.start()

    def finish(self, name: str) -> None:
        self.done.add(name)

    def _poll(self) -> None:
        while not self._stop.wait(PROGRESS_POLL_SECONDS):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - the console's progress must never stop a grid
                pass

    def refresh(self) -> None:
        lines = {name: line for name, line in self.source().items() if name not in self.done}
        if not self.terminal:
            self._print_plain(lines)
            return
        for i, name in enumerate(self.names):
            if name is not None and name not in lines:
                self.names[i] = None
                self.bars[i].set_description_str("", refresh=True)
        for name, line in sorted(lines.items()):
            if name not in self.names:
                if None not in self.names:
                    continue
                self.names[self.names.index(None)] = name
            self.bars[self.names.index(name)].set_description_str(f"  {name}: {line}", refresh=True)

    def _print_plain(self, lines: dict[str, str]) -> None:
        now = time.monotonic()
        for name, line in sorted(lines.items()):
            what = line.split("] ", 1)[-1].split(" · epoch")[0]  # the role, seeds, lr, model: no minutes, epoch, ETA
            last = self._printed.get(name)
            if last is None or last[0] != what or now - last[1] >= PLAIN_PROGRESS_SECONDS:
                self._printed[name] = (what, now)
                tqdm.write(f"  {name}: {line}", file=sys.stderr)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        for bar in self.bars:
            bar.close()


def progress_files(folder: str, estimates: dict[str, float]):
    """The progress of the cells running on this machine (their files in the runner's folder), with
    each cell's minutes so far and the runner's estimate."""
    def lines() -> dict[str, str]:
        out = {}
        for record in filter(None, (cell_progress.read(path) for path in Path(folder).glob("*.json"))):
            name, line = record["cell"], cell_progress.describe(record)
            if record.get("started"):
                guess = f" of ~{estimates[name]:.1f}" if name in estimates else ""
                line = f"[{(time.time() - record['started']) / 60:.1f}{guess} min] {line}"
            out[name] = line
        return out

    return lines


def progress_tags(tracker: Tracker, runner_id: str):
    """The progress of cells running elsewhere (Ray): their runs' tags, read every TAG_SECONDS."""
    state = {"at": 0.0, "lines": {}}

    def lines() -> dict[str, str]:
        if time.monotonic() - state["at"] >= cell_progress.TAG_SECONDS:
            state["at"] = time.monotonic()
            state["lines"] = {run.info.run_name: run.data.tags[cell_progress.PROGRESS_TAG]
                              for run in tracker.find_running({TAG["runner"]: runner_id})
                              if cell_progress.PROGRESS_TAG in run.data.tags}
        return state["lines"]

    return lines
