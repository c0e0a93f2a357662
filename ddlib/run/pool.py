"""The runner side of the local process pool: ``workers`` spawned processes on this machine, each executing one
cell at a time (:func:`ddlib.run.executors.execute_cell`), and stopping them all when the runner is
interrupted. Imports ``run.executors`` (the worker side), ``engine.device`` and the store's locks."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Callable, Sequence

from ddlib.run import executors  # execute_cell looked up at each submit: what a caller put there runs
from ddlib.run.executors import SIGNAL_POLL_SECONDS, STOP_SIGNALS, CellJob, CellOutcome, next_job, short_error, stop_signal
from ddlib.store.locks import release_store_locks

__all__ = ["LocalExecutor", "OnOutcome"]

OnOutcome = Callable[[CellJob, CellOutcome], None]


class LocalExecutor:
    """``workers`` spawned processes on this machine; with ``gpus`` (device ids) worker i sees only
    ``gpus[i % len(gpus)]`` (``CUDA_VISIBLE_DEVICES``), so several workers spread over the GPUs."""

    def __init__(self, workers: int, gpus: Sequence[str] | None = None):
        self.workers = max(1, workers)
        self.gpus = list(gpus) if gpus else None

    def threads_per_cell(self) -> int:
        from ddlib.engine.device import usable_cores

        return max(1, usable_cores() // self.workers)

    def run(self, jobs: Sequence[CellJob], on_outcome: OnOutcome) -> None:
        context = get_context("spawn")
        slots = None
        if self.gpus:
            slots = context.Queue()
            for i in range(self.workers):
                slots.put(self.gpus[i % len(self.gpus)])
        pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=context, initializer=executors._init_pool_worker,
                                   initargs=(slots,))
        pending, running, done = list(jobs), {}, set()

        def start_next() -> None:
            while pending and len(running) < self.workers:
                job = pending.pop(next_job(pending, list(running.values()), done))
                # Workers start (on submit) with SIGINT and SIGTERM blocked, inherited from this thread:
                # a Ctrl-C while they import waits until their handlers are set (no traceback per worker).
                blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
                try:
                    running[pool.submit(executors.execute_cell, job, True)] = job
                except BrokenProcessPool as exc:  # a worker died: every cell not yet started fails, as it did
                    on_outcome(job, CellOutcome(job.name, "failed", error=short_error(exc)))
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

        try:
            start_next()
            while running:  # one cell per free worker, chosen when the worker frees (next_job)
                finished, _ = wait(running, timeout=SIGNAL_POLL_SECONDS, return_when=FIRST_COMPLETED)
                if not finished:
                    continue
                ended = [(future, running.pop(future)) for future in finished]
                done.update(*(job.shares for _, job in ended))
                start_next()
                for future, job in ended:
                    try:
                        outcome = future.result()
                    except BaseException as exc:  # noqa: BLE001 - the worker itself died
                        outcome = CellOutcome(job.name, "failed", error=short_error(exc))
                    on_outcome(job, outcome)
        except BaseException as stop:
            release_store_locks(stop)  # an interruption inside a store read: its lock would block the workers' writes
            _terminate(pool, stop_signal(stop))
            raise
        pool.shutdown(wait=True)


def _terminate(pool: ProcessPoolExecutor, signum: int = signal.SIGTERM, grace: float = 15.0) -> None:
    """Stop every worker: ``signum`` (the signal that stopped the runner: each worker marks its run
    KILLED naming it, and kills its kernel), then SIGKILL."""
    processes = list((pool._processes or {}).values())  # noqa: SLF001 - no public handle on the workers
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            try:
                os.kill(process.pid, signum)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(5)
