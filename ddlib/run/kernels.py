"""A warm notebook kernel per worker: the cells a worker executes one after another share one kernel.

Starting an ipykernel and importing torch, ddlib and MLflow in it costs a cell about 5 CPU-seconds
(a 2-core Zen 5 EPYC; bench/README.md, issue 25: a third of the demo's CPU time was such per-cell
cost). A worker therefore keeps the kernel of a cell that FINISHED and hands it to its next cell, after clearing
the notebook's namespace (``%reset -f``) and setting the new cell's environment. What stays is
what a fresh kernel would build the same way: imported modules, the MLflow client, loaded datasets
(``ddlib.data.datasets`` caches them unchanged; nothing writes into them). A kernel whose cell
failed, timed out or was interrupted is shut down, and the next cell starts a fresh one; so does a
cell with another notebook folder or environment. ``DDLIB_WARM_KERNEL=0`` gives every cell a fresh
kernel. ``tests/test_runner.py`` checks that a warm kernel's metrics are bit for bit a fresh one's.

A fresh kernel is started here, not by papermill, and only handed on once it answered ``kernel_info``:
jupyter_client picks five free TCP ports, frees them and writes them to the connection file, and the
kernel binds them a second later. Another process (a kernel, or any client's outgoing connection)
can take one of them meanwhile; the kernel then dies with "Address already in use" and papermill
fails the cell with "Kernel died before replying to kernel_info" (seen once in 40 cells started by 4
workers beside other tests on a 2-core Zen 3). A kernel that dies before it answers is replaced, with
new ports, up to :data:`START_ATTEMPTS` times.
"""

from __future__ import annotations

import atexit
import json
import logging
import os

__all__ = ["WARM_KERNEL_ENV", "warm_kernels_enabled", "kernel_for", "cells_in_kernel", "release_kernel"]

WARM_KERNEL_ENV = "DDLIB_WARM_KERNEL"
START_TIMEOUT = 60.0
START_ATTEMPTS = 3  # kernels started for one cell when each dies before it answers (the port race)

log = logging.getLogger(__name__)

_state: dict = {"km": None, "key": None, "cells": 0}  # this process's kernel, what it was started for, cells run


def warm_kernels_enabled() -> bool:
    """Whether a worker keeps one warm kernel across its cells (on unless the environment turns it off)."""
    return os.environ.get(WARM_KERNEL_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


UNFREEZE_EVERY = 8  # cells: how often a kept kernel's frozen objects are collected again
# run after a fresh kernel's start and setup (its imports: torch, MLflow, the protocol) as after every prelude:
# without it the second cell's reset collected the whole imported stack once more (1.9 s of its 2.3 s
# prelude on a loaded 2-core Zen 3, bench/fixed_cost.py)
FREEZE = "import gc as _ddlib_gc; _ddlib_gc.freeze(); del _ddlib_gc\n"


def _prelude(env: dict, cell: int) -> str:
    """Code run in a kept kernel before its next notebook (its ``cell``-th): the previous notebook's
    names go (``%reset -f`` ends with a full garbage collection), the new cell's environment variables
    come (a kernel reads its environment once, at start). ``gc.freeze()`` then moves what survived
    (modules, the MLflow client, cached datasets) out of the collector's sight, so the next cell's
    collections, and the next reset's, scan only what that cell made (a full collection of the
    imported stack took 0.5 s on a 2-core Zen 5 EPYC, twice per cell). Frozen objects that later
    become cyclic garbage are not collected while frozen: every :data:`UNFREEZE_EVERY` cells the reset collects everything."""
    thaw = "import gc as _ddlib_gc; _ddlib_gc.unfreeze(); del _ddlib_gc\n" if cell % UNFREEZE_EVERY == 0 else ""
    return (thaw + "%reset -f\n"
            f"import os as _ddlib_os; _ddlib_os.environ.update({json.dumps(env)}); del _ddlib_os\n"
            + FREEZE)


def _client(km):
    """The kernel's own client, connected once and kept with it: a new client's ``wait_for_ready`` waits
    0.2 s for the IOPub channel to go quiet, twice per warm cell (prelude, running plan) before this
    (bench/fixed_cost.py). Replies to papermill's requests reach only papermill's client; what the
    kernel broadcasts on IOPub meanwhile queues here and is passed over (another request's messages)."""
    kc = _state.get("kc")
    if kc is None or _state.get("kc_of") is not km:
        _drop_client()
        kc = km.blocking_client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=START_TIMEOUT)
        except BaseException:
            kc.stop_channels()
            raise
        _state.update(kc=kc, kc_of=km)
    return kc


def _drop_client() -> None:
    kc, _state["kc"], _state["kc_of"] = _state.get("kc"), None, None
    if kc is not None:
        try:
            kc.stop_channels()
        except Exception:  # noqa: BLE001 - its kernel is gone already
            pass


def _run(km, code: str, timeout: float | None = START_TIMEOUT) -> None:
    kc = _client(km)
    reply = kc.execute_interactive(code, timeout=timeout, store_history=False, output_hook=lambda msg: None)
    if reply["content"].get("status") != "ok":
        raise RuntimeError(f"the kept kernel refused its prelude: {reply['content'].get('evalue')}")


def kernel_for(cwd: str, env: dict, cell_env: dict, extra_arguments: list[str], setup: str = ""):
    """A started kernel manager, its kernel ready, for a cell whose notebook runs in ``cwd`` with the
    process's environment ``env``: the kept one when warm kernels are on, it was started for the same
    (``cwd``, ``env``) and is alive (``cell_env`` then set in it), else a fresh one. With warm kernels
    off, the caller releases it after the cell (:func:`release_kernel`). ``setup``: code run in it next."""
    key = (cwd, json.dumps(env, sort_keys=True))
    km = _state["km"]
    if km is not None and (not warm_kernels_enabled() or _state["key"] != key or not _alive(km)):
        release_kernel()
        km = None
    if km is not None:
        try:
            _run(km, _prelude(cell_env, _state["cells"] + 1))
            _state["cells"] += 1
            if setup:
                _run(km, setup, timeout=None)
            return km
        except Exception:  # noqa: BLE001 - a kept kernel that does not answer is replaced
            release_kernel()
    km = _start(cwd, extra_arguments)
    _state.update(km=km, key=key, cells=1)
    if not _state.get("atexit"):
        atexit.register(release_kernel)
        _state["atexit"] = True
    # code the cell's kernel runs before its notebook (the worker's: its running plan, run.timing.hand_plan)
    _run(km, setup + FREEZE, timeout=None)
    return km


def _manager():
    from jupyter_client.manager import AsyncKernelManager

    return AsyncKernelManager(kernel_name="python3")


def _start(cwd: str, extra_arguments: list[str]):
    """A fresh kernel that answered ``kernel_info``; one that died first is replaced (module docstring)."""
    from jupyter_core.utils import run_sync

    for attempt in range(1, START_ATTEMPTS + 1):
        km = _manager()
        run_sync(km.start_kernel)(extra_arguments=extra_arguments, cwd=cwd)
        try:
            _client(km)  # connected once it answered kernel_info, and kept for the kernel's preludes
            return km
        except RuntimeError as exc:
            died = not _alive(km)
            _shutdown(km)
            if not died or attempt == START_ATTEMPTS:
                raise RuntimeError(f"the notebook kernel did not start (attempt {attempt} of {START_ATTEMPTS}): {exc}") from exc
            log.warning("the notebook kernel died before it answered (attempt %d of %d): starting another",
                        attempt, START_ATTEMPTS)
    raise AssertionError("unreachable")


def cells_in_kernel() -> int:
    """How many cells the current kernel has run, this one included (1: a fresh kernel)."""
    return _state["cells"]


def _alive(km) -> bool:
    from jupyter_core.utils import run_sync

    try:
        return bool(run_sync(km.is_alive)())
    except Exception:  # noqa: BLE001
        return False


def release_kernel() -> None:
    """Shut the kept kernel down (after a failed cell, after every cell with warm kernels off, or when
    the worker exits)."""
    _drop_client()
    km, _state["km"], _state["key"], _state["cells"] = _state["km"], None, None, 0
    if km is not None:
        _shutdown(km)


def _shutdown(km) -> None:
    from jupyter_core.utils import run_sync

    try:
        run_sync(km.shutdown_kernel)(now=True)
    except Exception:  # noqa: BLE001 - already gone (killed with the cell)
        pass
