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
