"""Cells as Ray tasks: on the cluster at an address, or on a local Ray instance started for the run, handed
over as its slots free (as the local pool does, :func:`ddlib.run.executors.next_job`). Imports
``run.executors`` (the worker side a task runs) and ``run.pool`` (what a cell's end is handed to)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Sequence

from ddlib.run import executors
from ddlib.run.executors import SIGNAL_POLL_SECONDS, CellJob, CellOutcome, ExecutorError, next_job, short_error
from ddlib.run.pool import OnOutcome
from ddlib.store.locks import release_store_locks

__all__ = ["RayExecutor", "RAY_INSTALL_HINT", "RAY_START_ATTEMPTS"]

RAY_START_ATTEMPTS = 3  # a local Ray start that times out on a loaded machine is tried this often
RAY_INSTALL_HINT = "pip install 'ddlib[cluster]' (in a checkout: make setup)"


class RayExecutor:
    """Each cell a Ray task (``num_cpus``, ``num_gpus`` per cell) on the cluster at ``address``
    (``auto``, ``ray://host:10001``), or on a local Ray instance started for the run (``workers``
    cells at a time; asked for 127.0.0.1, but Ray 2.60's processes still listen on every interface
    under the node's own address, behind Ray's token authentication: see docs/scale-out.md)."""

    def __init__(self, address: str | None, workers: int, cpus_per_cell: float = 1, gpus_per_cell: float = 0):
        self.address = address
        self.workers = max(1, workers)
        self.cpus_per_cell = cpus_per_cell
        self.gpus_per_cell = gpus_per_cell

    def threads_per_cell(self) -> int:
        return max(1, int(self.cpus_per_cell))

    def cells_at_once(self, resources: dict, cells: int) -> int:
        """Cells in flight: what the cluster's CPUs and GPUs hold now at ``cpus_per_cell`` and
        ``gpus_per_cell`` (a local instance: ``workers``), at least ``workers`` (an autoscaling cluster
        grows when asked). Cells are handed to Ray as slots free, not all at once, so that two cells
        computing the same shared work (K-Center's feature network, the full-data reference) do not
        start together on two nodes, each training it (``next_job``)."""
        slots = [int(resources.get(kind, 0) // need) for kind, need in (("CPU", self.cpus_per_cell),
                                                                         ("GPU", self.gpus_per_cell)) if need > 0]
        return max(1, min(cells, max(self.workers, min(slots) if slots else cells)))

    @staticmethod
    def check_installed() -> None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ExecutorError(f"--executor ray needs Ray: {RAY_INSTALL_HINT}") from None

    def _start_local_ray(self) -> None:
        """A local Ray instance for this grid. Ray gives its raylet a fixed 30 s to register (on a loaded
        machine it may not): such a start is tried again, :data:`RAY_START_ATTEMPTS` times in all, then
        reported in one line."""
        import ray

        env = {k: os.environ[k] for k in ("PYTHONPATH",) if os.environ.get(k)}
        for attempt in range(1, RAY_START_ATTEMPTS + 1):
            try:
                ray.init(num_cpus=max(1, int(self.workers * self.cpus_per_cell)), include_dashboard=False,
                         _node_ip_address="127.0.0.1", log_to_driver=False,
                         runtime_env={"env_vars": env} if env else None)
                return
            except Exception as error:  # noqa: BLE001 - Ray raises a bare Exception for this one
                if "timed out during startup" not in str(error):
                    raise
                ray.shutdown()
                if attempt == RAY_START_ATTEMPTS:
                    raise RuntimeError(f"its node did not start in {RAY_START_ATTEMPTS} tries of Ray's 30 s "
                                       "(a loaded machine?)") from None
                print(f"Ray's node did not start within its 30 s (try {attempt} of {RAY_START_ATTEMPTS}): "
                      "starting it again", file=sys.stderr)

    def run(self, jobs: Sequence[CellJob], on_outcome: OnOutcome) -> None:
        self.check_installed()
        import ray

        started_here = False
        if not ray.is_initialized():
            handler = signal.getsignal(signal.SIGTERM)
            try:
                if self.address is None:
                    self._start_local_ray()
                else:
                    ray.init(address=self.address, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as error:
                raise ExecutorError(f"cannot start or reach Ray (address {self.address or 'local'}): {error}") from None
            started_here = True
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, handler)  # ray.init installs its own; the runner's marks cells KILLED
        task = ray.remote(executors.execute_cell).options(num_cpus=self.cpus_per_cell, num_gpus=self.gpus_per_cell,
                                                max_retries=0)
        window = self.cells_at_once(ray.cluster_resources(), len(jobs))
        waiting, pending, ended = list(jobs), {}, set()

        def submit() -> None:  # as the local pool: one cell per free slot, chosen then (next_job)
            while waiting and len(pending) < window:
                job = waiting.pop(next_job(waiting, list(pending.values()), ended))
                pending[task.remote(job, False)] = job

        try:
            submit()
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1, timeout=SIGNAL_POLL_SECONDS)
                if not done:
                    continue
                job = pending.pop(done[0])
                ended.update(job.shares)
                submit()
                try:
                    outcome = ray.get(done[0])
                except Exception as exc:  # noqa: BLE001 - the task's worker died or Ray failed it
                    outcome = CellOutcome(job.name, "failed", error=short_error(getattr(exc, "cause", None) or exc))
                on_outcome(job, outcome)
        except BaseException as stop:
            release_store_locks(stop)
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        finally:
            if started_here:
                ray.shutdown()
