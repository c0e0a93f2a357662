"""Device choice and seeding, in one place so every protocol does it the same way."""

from __future__ import annotations

import ctypes
import os
import random
import sys
import warnings

import numpy as np
import torch

from ddlib.store.cache import cache_dir


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` picks CUDA when present, else the CPU; anything else is passed to torch. Work
    bound for the CPU first tunes the process's allocator (:func:`tune_cpu_allocator`)."""
    if isinstance(device, torch.device):
        dev = device
    elif device in (None, "auto"):
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {device!r} requested but CUDA is not available")
    if dev.type == "cpu":
        tune_cpu_allocator()
    elif dev.type == "cuda":
        exact_fp32_on_cuda()
    return dev


def exact_fp32_on_cuda() -> None:
    """fp32 means fp32 on a GPU too: cuDNN's convolutions default to TF32 (a 10-bit mantissa) on
    Ampere and later, which made the batched and sequential modes' weights differ by 2.7e-3 after
    2 epochs on an H200 (bench/README.md) and would make a GPU's fp32 row another precision than
    the CPU's. bf16 runs (``precision: auto`` on CUDA) are untouched: autocast picks their dtype."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


# --------------------------------------------------------------------------- the CPU allocator

CPU_ALLOCATOR_ENV = "DDLIB_CPU_ALLOCATOR"
CPU_ALLOCATORS = ("tuned", "system")
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)
_allocator_state: list[str] = []  # the resolved setting, once: "tuned", "system" or "unavailable"


def tune_cpu_allocator() -> str:
    """Keep freed memory in the process instead of returning it to the kernel after every tensor.

    glibc serves every allocation above 32 MB (a batch's activations: 100 CIFAR images through a
    128-channel conv are 52 MB) with a fresh ``mmap`` and gives it back with ``munmap`` on free, so
    each training step and test batch pays page faults on zeroed pages: on the 2-core Zen 5 EPYC of
    ``bench/README.md`` half of a CPU cell's time was kernel (sys) time. ``mallopt`` (mmap off,
    trimming only above 2 GB; the fix PyTorch's CPU tuning guide gets from jemalloc/tcmalloc)
    makes ConvNet-3 test passes 2.2x and training steps 1.55x faster, bit for bit the same results
    (the allocator moves no numbers). The process then keeps its peak memory until it exits.

    Once per process, on Linux with glibc; ``DDLIB_CPU_ALLOCATOR=system`` leaves the allocator alone.
    Returns what is in effect: ``"tuned"``, ``"system"`` or ``"unavailable"`` (not glibc)."""
    if _allocator_state:
        return _allocator_state[0]
    wanted = os.environ.get(CPU_ALLOCATOR_ENV, "tuned") or "tuned"
    if wanted not in CPU_ALLOCATORS:
        raise ValueError(f"environment variable {CPU_ALLOCATOR_ENV}={wanted!r}: must be one of {CPU_ALLOCATORS}")
    state = wanted
    if wanted == "tuned":
        state = "unavailable"
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None)
                libc.gnu_get_libc_version  # noqa: B018 (glibc only: musl's mallopt does nothing)
                if libc.mallopt(_M_MMAP_MAX, 0) and libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1):
                    state = "tuned"
            except (OSError, AttributeError):
                pass
    _allocator_state.append(state)
    return state


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) for code that draws from global generators."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A private generator: draws from it do not disturb (or depend on) global RNG state."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


# --------------------------------------------------------------------------- compiled kernels

_COMPILE_CACHE: list[str] = []  # the folder this process pointed Inductor at (set once)


def machine_identity() -> dict:
    """What a result computed here depends on besides its inputs, for keys of caches that a home
    folder may share between machines: torch's version, the CPU model and ISA flags, the kernel
    paths torch and oneDNN were capped to, and the GPUs (with cuDNN's version)."""
    import platform

    flags = sorted(f for f in _cpu_flags() if f.startswith(("avx", "amx", "fma", "f16c", "sse")))
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {"torch": str(torch.__version__), "machine": platform.machine(), "cpu": _cpu_model(), "flags": flags,
            "aten": os.environ.get("ATEN_CPU_CAPABILITY", ""), "onednn": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
            "capability": torch.backends.cpu.get_cpu_capability(), "gpus": gpus,
            **({"cudnn": torch.backends.cudnn.version()} if gpus else {})}


def compile_cache_dir() -> str:
    """Point Inductor's on-disk kernel cache (``TORCHINDUCTOR_CACHE_DIR``) at a folder of this
    machine's kernel paths, and return it. Inductor's cache key leaves out the instruction set the
    kernels were generated for: measured, kernels cached by an AVX-512 process and reused under
    ``ATEN_CPU_CAPABILITY=avx2`` trained to NaN, and the reverse crashed the process. A home folder
    shared by cluster nodes with different CPUs would do the same. So the folder is keyed by torch's
    version, the CPU model and ISA flags, the kernel-path caps and the GPUs; a folder the user set
    is kept as it is."""
    if _COMPILE_CACHE:
        return _COMPILE_CACHE[0]
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen and os.path.abspath(chosen) != _inductor_default():  # torch writes its default there on first use
        _COMPILE_CACHE.append(chosen)
        return chosen
    import hashlib

    key = hashlib.sha256(repr(sorted(machine_identity().items())).encode()).hexdigest()[:16]
    folder = str(cache_dir() / "inductor" / key)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    _COMPILE_CACHE.append(folder)
    return folder


def _inductor_default() -> str:
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        return os.path.abspath(default_cache_dir())
    except (ImportError, AttributeError):  # another torch layout: take any folder set as the user's
        return ""


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (what Slurm, a cpuset container or ``taskset``
    grants), not the machine's count, which on a 4-core share of a 64-core node would give each of
    two workers 32 threads on 4 cores."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity API (macOS)
        return max(1, os.cpu_count() or 1)


def configure_threads() -> None:
    """Honour ``DDLIB_NUM_THREADS`` (the batch runner sets it so parallel workers share the cores)."""
    n = os.environ.get("DDLIB_NUM_THREADS")
    if n:
        torch.set_num_threads(max(1, int(n)))


def forget_compiled() -> None:
    """Drop what ``torch.compile`` compiled earlier in this process (nothing where it never ran).

    A cell must give in a warm kernel, or after other cells run by hand, what it gives in a fresh
    process. Dynamo compiles a frame once per input shape and, past ``recompile_limit`` (8) shapes,
    runs it eagerly from then on with one warning: a later cell with the ``compile`` switch would then
    train some of its models eagerly, numbers a fresh process does not give (within 1e-7, not bit for
    bit). Called when a cell opens. The kernels stay in Inductor's caches (:func:`compile_cache_dir`):
    compiling a shape seen before again took 0.17 s for the digits ConvNet, against 14 s cold (a 2-core
    Zen 5 EPYC)."""
    import sys

    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work so wall-clock timings measure the work, not the launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------- reduced precision

PRECISIONS = ("fp32", "bf16", "auto")
EMULATED_BF16 = ("precision: bf16 on a CPU without native bf16 (AVX-512 BF16 or AMX) is emulated: torch runs its "
                 "convolutions on a slow reference path, about 26x fp32's time per training step on a Zen 3 "
                 "(AVX2); precision: auto picks fp32 on this CPU")


class EmulatedBf16Warning(UserWarning):
    """``precision: bf16`` asked for by name where the CPU has no native bf16: it runs, slowly."""


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA) under which its convolutions have no native bf16 path.
_ISAS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


def _isa_allows_bf16() -> bool:
    """False where the kernels are capped below native bf16 (``ONEDNN_MAX_CPU_ISA=AVX2``, or
    ``ATEN_CPU_CAPABILITY`` at avx2 or lower): an AVX-512 machine told to take the AVX2 paths then
    behaves as an AVX2-only CPU does, ``precision: auto`` included."""
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    return onednn not in _ISAS_WITHOUT_BF16 and aten not in ("avx2", "default", "none")


def bf16_supported(device: torch.device) -> bool:
    """Whether ``device`` runs bfloat16 matrix products natively: CUDA with bf16 support (Ampere and
    later), or a CPU with AVX-512 BF16 or AMX tiles (oneDNN then computes convolutions in bf16;
    elsewhere bf16 is emulated and slower than fp32)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        if not _isa_allows_bf16():
            return False
        probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
        amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
        if probe is not None:
            return bool(probe() or (amx is not None and amx()))
        return bool({"avx512_bf16", "amx_bf16"} & _cpu_flags())
    return False


def resolve_precision(precision: str, device: torch.device) -> str:
    """``"fp32"`` or ``"bf16"``: what ``precision`` (fp32, bf16, auto) means on ``device``.
    ``auto`` is bf16 where the device supports it natively (:func:`bf16_supported`), else fp32."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "auto":
        return "bf16" if bf16_supported(device) else "fp32"
    if precision == "bf16" and torch.device(device).type == "cpu" and not bf16_supported(device):
        warnings.warn(EMULATED_BF16, EmulatedBf16Warning, stacklevel=2)
    return precision


def run_precision(recipe, device: torch.device, objective: bool = False) -> str:
    """The precision a training runs in: ``recipe.precision`` (a :class:`ddlib.engine.recipe.Recipe`'s),
    with ``auto`` resolved on ``device``. An adversarial-training ``objective`` (gradients with respect
    to the inputs) keeps ``auto`` at fp32: bf16 was measured to keep accuracy for plain training only;
    ``bf16`` given explicitly applies."""
    if objective and recipe.precision == "auto":
        return "fp32"
    return resolve_precision(recipe.precision, device)


def autocast(precision: str, device: torch.device):
    """The autocast context of a resolved precision: bf16 autocast, or nothing at all for fp32 (so
    fp32 runs are bit for bit what they were without the switch)."""
    import contextlib

    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
