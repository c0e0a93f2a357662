"""Device choice and seeding, in one place so every protocol does it the same way."""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` picks CUDA when present, else the CPU; anything else is passed to torch."""
    if isinstance(device, torch.device):
        return device
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} requested but CUDA is not available")
    return dev


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


def configure_threads() -> None:
    """Honour ``DDLIB_NUM_THREADS`` (the batch runner sets it so parallel workers share the cores)."""
    n = os.environ.get("DDLIB_NUM_THREADS")
    if n:
        torch.set_num_threads(max(1, int(n)))


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work so wall-clock timings measure the work, not the launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------- reduced precision

PRECISIONS = ("fp32", "bf16", "auto")


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def bf16_supported(device: torch.device) -> bool:
    """Whether ``device`` runs bfloat16 matrix products natively: CUDA with bf16 support (Ampere and
    later), or a CPU with AVX-512 BF16 or AMX tiles (oneDNN then computes convolutions in bf16;
    elsewhere bf16 is emulated and slower than fp32)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
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
    return precision


def autocast(precision: str, device: torch.device):
    """The autocast context of a resolved precision: bf16 autocast, or nothing at all for fp32 (so
    fp32 runs are bit for bit what they were without the switch)."""
    import contextlib

    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
