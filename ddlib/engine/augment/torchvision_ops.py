"""The ``torchvision`` op: any ``torchvision.transforms.v2`` list, applied to each image separately in
pixel space, its randomness seeded from the op's generator."""

from __future__ import annotations

import contextlib
import inspect
from typing import Callable, Mapping

import torch

from ddlib.engine.augment.pipeline import AugmentContext, register_op
from ddlib.specs.registry import describe_value
from ddlib.engine.augment._pixels import _PixelSpace

_TV_REFUSED = {"MixUp", "CutMix"}  # they need labels: use the mixup / cutmix ops


def _build_tv(items) -> tuple[Callable, list]:
    from torchvision.transforms import v2

    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError(
            f"augmentation op 'torchvision': 'transforms' must be a non-empty list of transform names or "
            f"{{Name: {{kwargs}}}}, got {items!r}"
        )
    built, resolved = [], []
    for item in items:
        if isinstance(item, str):
            name, kwargs = item, {}
        elif isinstance(item, Mapping) and len(item) == 1:
            ((name, kwargs),) = item.items()
            kwargs = {} if kwargs is None else kwargs
        else:
            raise ValueError(f"augmentation op 'torchvision': each transform must be a name or {{Name: {{kwargs}}}}, "
                             f"got {item!r}")
        cls = getattr(v2, str(name), None)
        if not (inspect.isclass(cls) and issubclass(cls, v2.Transform)) or name in _TV_REFUSED:
            raise ValueError(f"augmentation op 'torchvision': {name!r} is not a usable torchvision.transforms.v2 transform")
        if not isinstance(kwargs, Mapping):
            raise ValueError(f"augmentation op 'torchvision': kwargs of {name!r} must be a mapping, got {kwargs!r}")
        try:
            built.append(cls(**kwargs))
        except (TypeError, ValueError) as e:
            raise ValueError(f"augmentation op 'torchvision': {name}({describe_value(kwargs)}) is invalid: {e}") from None
        resolved.append({name: dict(kwargs)} if kwargs else name)
    return v2.Compose(built), resolved


@contextlib.contextmanager
def _forked_global_rng(device: torch.device, seed: int):
    """The global CPU RNG (and the device's, on CUDA) forked, seeded with ``seed``, restored on exit.
    torchvision v2 draws its parameters from the global RNG; this makes them a function of our
    generator and leaves the caller's global state as it was."""
    cuda = device.type == "cuda"
    index = (device.index if device.index is not None else torch.cuda.current_device()) if cuda else None
    with torch.random.fork_rng(devices=[index] if cuda else [], device_type="cuda"):
        torch.default_generator.manual_seed(seed)
        if cuda:
            torch.cuda.default_generators[index].manual_seed(seed)
        yield



@register_op("torchvision", list_param="transforms")
def _torchvision_factory(ctx: AugmentContext, *, transforms=()):
    """Any list of ``torchvision.transforms.v2`` transforms, applied to each image separately (so each
    draws its own parameters) in pixel space: de-normalise with the dataset mean/std, apply,
    re-normalise. Randomness: one int drawn from the generator seeds a forked global RNG.
    Float images go in, so torchvision's float semantics apply (e.g. colour ops clamp to [0, 1])."""
    compose, resolved = _build_tv(transforms)
    space = _PixelSpace(ctx, "torchvision")

    def fn(x, targets, g):
        space.stats(x)  # channel check before drawing
        seed = int(torch.randint(0, 2**62, (1,), generator=g, device=x.device).item())
        pixels = space.to_pixels(x)
        with _forked_global_rng(x.device, seed):
            out = torch.stack([compose(img) for img in pixels])
        if out.shape != x.shape:
            raise ValueError(f"torchvision op changed the image shape {tuple(x.shape)} -> {tuple(out.shape)}")
        return space.to_normalized(out), targets

    return fn, {"transforms": resolved}
