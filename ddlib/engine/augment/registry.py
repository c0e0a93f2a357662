"""The augmentation registry: ``register_op``, the :class:`Augment` hook and :func:`create_augment`.

Kept apart from the op files (as timm keeps ``_registry.py`` apart from its models): every family
module imports this one to register its ops, and the package's ``__init__`` imports both, so
imports run one way.
"""


from __future__ import annotations

import inspect
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

__all__ = ["Augment", "AugmentContext", "create_augment", "list_ops", "op_params", "register_op"]

OpFn = Callable[[torch.Tensor, torch.Tensor, torch.Generator], "tuple[torch.Tensor, torch.Tensor]"]


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class AugmentContext:
    """What an op factory may need besides its own params: the dataset's normalisation (pixel-space
    ops de-normalise, apply, re-normalise) and the number of classes (label-mixing ops)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    num_classes: int


@dataclass(frozen=True)
class _Entry:
    factory: Callable
    defaults: dict
    list_param: str | None


_REGISTRY: dict[str, _Entry] = {}


def register_op(name: str, *, list_param: str | None = None):
    """Register ``factory(ctx, *, param=default, ...) -> fn`` (or ``(fn, resolved_params)``) as op ``name``.

    The keyword-only parameters of the factory are the op's YAML params (anything else is refused,
    naming the key); ``fn(x, targets, generator) -> (x, targets)``. ``list_param`` lets YAML give
    that one param as a bare list (``{torchvision: [...]}``).
    """

    def decorate(factory):
        if name in _REGISTRY:
            raise ValueError(f"augmentation op {name!r} is already registered")
        sig = inspect.signature(factory)
        defaults = {}
        for p in list(sig.parameters.values())[1:]:
            if p.kind is not inspect.Parameter.KEYWORD_ONLY or p.default is inspect.Parameter.empty:
                raise TypeError(f"op {name!r}: params after ctx must be keyword-only with defaults ({p.name})")
            defaults[p.name] = p.default
        if list_param is not None and list_param not in defaults:
            raise TypeError(f"op {name!r}: list_param {list_param!r} is not a parameter")
        _REGISTRY[name] = _Entry(factory, defaults, list_param)
        return factory

    return decorate


def list_ops() -> list[str]:
    """Names of the registered ops, sorted."""
    return sorted(_REGISTRY)


def op_params(name: str) -> tuple[str, ...]:
    """The YAML parameters of a registered op (all optional: the op's defaults fill them)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown augmentation op {name!r}; known: {list_ops()}")
    return tuple(_REGISTRY[name].defaults)


def _fmt(value: Any) -> str:
    """Compact, canonical text for a param value (the describe() string is an MLflow param)."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


class _Op:
    """One configured op: its name, resolved params and function."""

    def __init__(self, name: str, params: dict, fn: OpFn):
        self.name, self.params, self.fn = name, params, fn

    def __call__(self, x, targets, generator):
        return self.fn(x, targets, generator)

    def describe(self) -> str:
        if not self.params:
            return self.name
        return f"{self.name}(" + ", ".join(f"{k}={_fmt(v)}" for k, v in self.params.items()) + ")"


class Augment:
    """The augmentation hook: ``x, targets = augment(x, targets, generator)`` applies the ops in order.

    ``name`` (= ``describe()``) spells out every op with all its params, defaults included, so the
    MLflow param says exactly what ran.
    """

    def __init__(self, ops: Sequence[_Op]):
        if not ops:
            raise ValueError("an Augment needs at least one op (use None for no augmentation)")
        self.ops = list(ops)
        self.name = " + ".join(op.describe() for op in self.ops)

    def describe(self) -> str:
        return self.name

    def __call__(self, x: torch.Tensor, targets: torch.Tensor, generator: torch.Generator):
        if x.dim() != 4 or not x.is_floating_point():
            raise ValueError(f"augment expects a float N x C x H x W batch, got {tuple(x.shape)} {x.dtype}")
        if len(targets) != len(x):
            raise ValueError(f"{len(x)} images but {len(targets)} targets")
        for op in self.ops:
            x, targets = op(x, targets, generator)
        return x, targets

    def __repr__(self) -> str:
        return f"Augment({self.name})"


def _parse_spec(spec) -> list[tuple[str, Any]]:
    if spec is None:
        return []
    if isinstance(spec, (str, Mapping)):
        items = [spec]
    elif isinstance(spec, (list, tuple)):
        items = list(spec)
    else:
        raise ValueError(f"augmentation spec must be None, an op name or a list of ops, got {spec!r}")
    parsed = []
    for item in items:
        if isinstance(item, str):
            parsed.append((item, None))
        elif isinstance(item, Mapping) and len(item) == 1:
            ((name, params),) = item.items()
            if not isinstance(name, str):
                raise ValueError(f"augmentation op name must be a string, got {name!r}")
            parsed.append((name, params))
        else:
            raise ValueError(
                f"each augmentation op must be a name or a single-key mapping {{op: {{params}}}}, got {item!r}"
            )
    return parsed


def create_augment(spec, *, mean: Sequence[float], std: Sequence[float], num_classes: int) -> Augment | None:
    """Build the hook from a YAML spec; ``None``, ``"none"`` and ``[]`` give ``None`` (no augmentation).

    Everything is validated here, before training: an unknown op, an unknown param or a bad value
    raises ``ValueError`` naming the op and the key.
    """
    mean_t, std_t = tuple(float(m) for m in mean), tuple(float(s) for s in std)
    if len(mean_t) != len(std_t) or not mean_t or any(s <= 0 for s in std_t):
        raise ValueError(f"mean/std must be equally long with std > 0, got {mean} / {std}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    ctx = AugmentContext(mean_t, std_t, int(num_classes))
    ops = []
    for name, params in _parse_spec(spec):
        if name not in _REGISTRY:
            raise ValueError(f"unknown augmentation op {name!r}; known: {list_ops()}")
        entry = _REGISTRY[name]
        if params is None:
            params = {}
        elif isinstance(params, (list, tuple)) and entry.list_param is not None:
            params = {entry.list_param: list(params)}
        elif not isinstance(params, Mapping):
            raise ValueError(f"augmentation op {name!r}: params must be a mapping, got {params!r}")
        unknown = sorted(str(k) for k in set(params) - set(entry.defaults))
        if unknown:
            raise ValueError(
                f"augmentation op {name!r}: unknown parameter(s) {unknown}; known: {sorted(entry.defaults)}"
            )
        if name == "none":
            continue
        made = entry.factory(ctx, **dict(params))
        fn, resolved = made if isinstance(made, tuple) else (made, {**entry.defaults, **params})
        ops.append(_Op(name, dict(resolved), fn))
    return Augment(ops) if ops else None


@register_op("none")
def _none_factory(ctx: AugmentContext):
    """No augmentation (dropped from the pipeline; a spec of only ``none`` gives ``None``)."""

    def fn(x, targets, g):
        return x, targets

    return fn
