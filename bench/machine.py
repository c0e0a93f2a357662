"""The machine a benchmark ran on, recorded beside its numbers: CPU model and the flags that pick
PyTorch's kernels (AVX2, AVX-512, native bf16), the kernel path in use (``ATEN_CPU_CAPABILITY``,
``ONEDNN_MAX_CPU_ISA`` can force AVX2 on an AVX-512 CPU), threads, GPU, and the load average.
Speed is compared only as ratios within one run; these fields say which CPU a number belongs to."""

from __future__ import annotations

import os
import platform

import torch

from ddlib.engine.device import _cpu_flags, _cpu_model

ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_model() -> str:
    return _cpu_model() or platform.processor() or platform.machine()


def cpu_family_model() -> str:
    """``family/model`` from /proc/cpuinfo (a virtual machine often names its CPU "AMD EPYC" only:
    family 25 is Zen 3 / Zen 4, 26 is Zen 5)."""
    found = {}
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key = line.split(":", 1)[0].strip()
                if key in ("cpu family", "model") and key not in found:
                    found[key] = line.split(":", 1)[1].strip()
                if len(found) == 2:
                    break
    except OSError:
        pass
    return f"{found.get('cpu family', '?')}/{found.get('model', '?')}"


def cpu_flags() -> list[str]:
    have = _cpu_flags()
    return [f for f in ISA_FLAGS if f in have]


def machine_info(device: str | torch.device | None = None) -> dict:
    """Everything needed to tell two runs' machines apart (call at the start; add a final load yourself)."""
    info = {"platform": platform.platform(), "cpu_model": cpu_model(), "cpu_family_model": cpu_family_model(),
            "cpu_flags": cpu_flags(),
            "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "forced_isa": {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if k in os.environ},
            "load_average_start": [round(v, 2) for v in os.getloadavg()]}
    if device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available():
        info.update(gpu_info(torch.device(device)))
    info["commit"] = commit()
    return info


def gpu_info(device: torch.device) -> dict:
    """The GPU, its memory, the driver, CUDA and cuDNN: what a GPU number is recorded with."""
    props = torch.cuda.get_device_properties(device)
    out = {"gpu": props.name, "gpu_memory_mib": props.total_memory // 2**20,
           "gpu_multiprocessors": props.multi_processor_count, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "driver": None}
    try:
        import subprocess

        out["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        pass
    return out


def commit() -> str | None:
    """The commit measured: ``$DDLIB_BENCH_COMMIT`` (a device machine gets the tree without .git, so the
    GPU driver script passes it), else ``git rev-parse HEAD`` with ``+dirty`` when the tree has changes."""
    if os.environ.get("DDLIB_BENCH_COMMIT"):
        return os.environ["DDLIB_BENCH_COMMIT"]
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=20).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def write_results(result: dict, path) -> None:
    """Write a benchmark's JSON (``bench/results/`` is created on first use) and say where."""
    import json
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
