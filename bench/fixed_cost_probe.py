"""The timing probe of bench/fixed_cost.py: copied as ``sitecustomize.py`` into a folder put first on
``PYTHONPATH``, so every process of a ``ddlib run`` (the runner, its pool worker, the notebook kernel)
loads it at start and, with ``DDLIB_FIXED_COST_LOG`` set, appends one JSON line per timed call to that
file. Nothing in ddlib changes: functions are wrapped as their modules are imported.

Each timed call belongs to a *part* (imports, mlflow, dataset_load, device_move, cuda_init, own_work,
cell, kernel, notebook) and is logged with its total and *exclusive* seconds (less the timed calls
nested in it), so parts add up without counting anything twice. Only the main thread is timed
(the worker's heartbeat thread writes to MLflow beside the cell, not in its path)."""

import json
import os
import sys
import threading
import time

LOG = os.environ.get("DDLIB_FIXED_COST_LOG")


def _cmdline() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return " ".join(getattr(sys, "argv", []))


def _process_started() -> float | None:
    """When this process was created (Linux: /proc), so a process's start before Python ran is counted."""
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _role(cmd: str) -> str:
    if "ipykernel" in cmd:
        return "kernel"
    if "multiprocessing" in cmd or "spawn_main" in cmd:
        return "worker"
    if "ddlib" in cmd:
        return "runner"
    return "other"


if LOG:
    _ROLE, _PID = _role(_cmdline()), os.getpid()
    _MAIN = threading.main_thread()
    _STACK: list = []  # [part, start, nested seconds] of the calls running on the main thread

    def emit(event: str, **fields) -> None:
        line = json.dumps({"pid": _PID, "role": _ROLE, "event": event, "t": time.time(), **fields}) + "\n"
        fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def timed(part: str, fn, label: str | None = None, note=None):
        """``fn`` wrapped: its main-thread calls logged as ``part`` (total and exclusive seconds)."""
        name = label or getattr(fn, "__qualname__", str(fn))

        def wrapper(*args, **kwargs):
            if threading.current_thread() is not _MAIN:
                return fn(*args, **kwargs)
            frame = [part, time.perf_counter(), 0.0]
            _STACK.append(frame)
            started = time.time()
            try:
                return fn(*args, **kwargs)
            finally:
                total = time.perf_counter() - frame[1]
                _STACK.pop()
                if _STACK:
                    _STACK[-1][2] += total
                extra = note(args, kwargs) if note else {}
                emit("call", part=part, name=name, start=started, total=round(total, 6),
                     exclusive=round(total - frame[2], 6), depth=len(_STACK), **extra)

        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):  # pickled by reference as fn was
            if hasattr(fn, attr):
                setattr(wrapper, attr, getattr(fn, attr))
        wrapper.__wrapped__ = fn
        return wrapper

    def _wrap_attr(owner, attr: str, part: str, **kw) -> None:
        fn = getattr(owner, attr, None)
        if fn is not None and not hasattr(fn, "__wrapped__"):
            setattr(owner, attr, timed(part, fn, **kw))

    def _patch_mlflow_client(module) -> None:
        cls = module.MlflowClient
        for attr, value in list(vars(cls).items()):
            if callable(value) and (not attr.startswith("_") or attr == "__init__"):
                setattr(cls, attr, timed("mlflow", value, label=f"MlflowClient.{attr}"))

    def _patch_tracking(module) -> None:
        for attr in ("client", "init_store", "create_sqlite_store"):
            _wrap_attr(module, attr, "mlflow", label=f"tracking.{attr}")

    def _patch_datasets(module) -> None:
        _wrap_attr(module, "load_dataset", "dataset_load", label="load_dataset")
        _wrap_attr(module, "reduce_dataset", "dataset_load", label="reduce_dataset")

    def _patch_device_copies(module) -> None:
        _wrap_attr(module, "on_device", "device_move", label="on_device")

    def _patch_test_pass(module) -> None:
        _wrap_attr(module, "_prepared", "device_move", label="test_pass._prepared")
        _wrap_attr(module, "test_trained", "own_work", label="test_trained")

    def _patch_train(module) -> None:
        _wrap_attr(module, "train_and_test", "own_work", label="train_and_test")

    def _patch_cuda(module) -> None:
        lazy = module._lazy_init

        def lazy_init():
            if module.is_initialized():
                return lazy()
            return timed("cuda_init", lazy, label="torch.cuda._lazy_init")()

        lazy_init.__wrapped__ = lazy
        module._lazy_init = lazy_init

    def _patch_executors(module) -> None:
        _wrap_attr(module, "execute_cell", "cell", label="execute_cell",
                   note=lambda a, k: {"cell": getattr(a[0] if a else k.get("job"), "name", "?")})

    def _patch_kernels(module) -> None:
        _wrap_attr(module, "kernel_for", "kernel", label="kernel_for",
                   note=lambda a, k: {"cells_in_kernel": module.cells_in_kernel()})
        _wrap_attr(module, "_start", "kernel", label="kernels._start")

    def _patch_papermill(module) -> None:
        _wrap_attr(module, "execute_notebook", "notebook", label="papermill.execute_notebook")

    def _patch_cell(module) -> None:
        cls = module.Cell
        _wrap_attr(cls, "close", "cell_close", label="Cell.close")
        opener = vars(cls)["open"].__func__
        cls.open = classmethod(timed("cell_open", opener, label="Cell.open"))

    PATCHES = {"mlflow.tracking.client": _patch_mlflow_client, "ddlib.store.tracking": _patch_tracking,
               "ddlib.data.datasets": _patch_datasets, "ddlib.data.device_copies": _patch_device_copies,
               "ddlib.engine.test_pass": _patch_test_pass, "ddlib.engine.train": _patch_train,
               "torch.cuda": _patch_cuda, "ddlib.run.executors": _patch_executors, "ddlib.run.kernels": _patch_kernels,
               "papermill": _patch_papermill, "ddlib.protocols.cell": _patch_cell}

    class _Finder:
        """Wraps every module's execution: outermost imports are timed (part ``imports``), and the modules
        of :data:`PATCHES` are patched right after they ran (before anyone imports a name from them)."""

        def find_spec(self, fullname, path=None, target=None):
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
            loader = spec.loader
            if (loader is None or isinstance(loader, type) or not hasattr(loader, "exec_module")
                    or getattr(loader, "_fixed_cost", False)):  # a class (builtins, frozen): shared, left alone
                return spec
            run = loader.exec_module

            def exec_module(module, run=run):
                if _STACK and _STACK[-1][0] == "imports" or threading.current_thread() is not _MAIN:
                    run(module)  # nested in an import already timed (or off the main thread)
                else:
                    timed("imports", run, label=f"import {fullname}")(module)
                if fullname in PATCHES:
                    PATCHES[fullname](module)

            try:
                loader.exec_module = exec_module
                loader._fixed_cost = True
            except AttributeError:
                pass
            return spec

    sys.meta_path.insert(0, _Finder())
    emit("process", created=_process_started(), cmd=_cmdline()[:300])
