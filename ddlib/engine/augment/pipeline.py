"""The op registry (``OPS``, ``register_op``) and the :class:`Augment` pipeline :func:`create_augment`
builds from a spec.

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

from ddlib.specs.registry import Entry, Registry, Spec

__all__ = ["Augment", "AugmentContext", "OPS", "create_augment", "list_ops", "op_params", "register_op"]

OpFn = Callable[[torch.Tensor, torch.Tensor, torch.Generator], "tuple[torch.Tensor, torch.Tensor]"]


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class AugmentContext:
    """What an op factory may need besides its own params: the dataset's normalisation (pixel-space
    ops de-normalise, apply, re-normalise) and the number of classes (label-mixing ops)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    num_classes: int


class OpSpec(Spec):
    """An op's spec. Its values are checked by the op's factory (which may return them resolved),
    not when the spec is parsed, and written as given (``scale=2`` stays ``2``)."""

    @classmethod
    def check(cls, entry: Entry, key: str, value: Any) -> Any:
        return value


OPS: Registry = Registry("augmentation op", spec=OpSpec)


def register_op(name: str, *, list_param: str | None = None):
    """Register ``factory(ctx, *, param=default, ...) -> fn`` (or ``(fn, resolved_params)``) as op ``name``.

    The keyword-only parameters of the factory are the op's YAML params (anything else is refused,
    naming the key); ``fn(x, targets, generator) -> (x, targets)``. ``list_param`` lets YAML give
    that one param as a bare list (``{torchvision: [...]}``).
    """

    def decorate(factory):
        for p in list(inspect.signature(factory).parameters.values())[1:]:
            if p.kind is not inspect.Parameter.KEYWORD_ONLY or p.default is inspect.Parameter.empty:
                raise TypeError(f"op {name!r}: params after ctx must be keyword-only with defaults ({p.name})")
        OPS.add(name, factory, list_param=list_param)
        return factory

    return decorate


def list_ops() -> list[str]:
    """Names of the registered ops, sorted."""
    return OPS.names()


def op_params(name: str) -> tuple[str, ...]:
    """The YAML parameters of a registered op (all optional: the op's defaults fill them)."""
    return tuple(OPS.params(name))


class _Op:
    """One configured op: its spec (name and resolved params) and function."""

    def __init__(self, spec: OpSpec, fn: OpFn):
        self.spec, self.fn = spec, fn
        self.name, self.params = spec.name, spec.params

    def __call__(self, x, targets, generator):
        return self.fn(x, targets, generator)

    def describe(self) -> str:
        return self.spec.describe()


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
        """The ops' canonical texts joined by `` + ``, which the trainings of this augmentation are keyed by."""
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


def _parse_spec(spec) -> list[OpSpec]:
    if spec is None:
        return []
    if isinstance(spec, (str, Mapping)):
        items = [spec]
    elif isinstance(spec, (list, tuple)):
        items = list(spec)
    else:
        raise ValueError(f"augmentation spec must be None, an op name or a list of ops, got {spec!r}")
    for item in items:
        if isinstance(item, Mapping) and len(item) == 1:
            (name,) = item
            if not isinstance(name, str):
                raise ValueError(f"augmentation op name must be a string, got {name!r}")
        elif not isinstance(item, str):
            raise ValueError(
                f"each augmentation op must be a name or a single-key mapping {{op: {{params}}}}, got {item!r}"
            )
    return [OPS.parse(item) for item in items]


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
    for parsed in _parse_spec(spec):
        if parsed.name == "none":
            continue
        made = parsed.entry.factory(ctx, **{k: parsed.params[k] for k in parsed.given})
        fn, resolved = made if isinstance(made, tuple) else (made, parsed.params)
        ops.append(_Op(OpSpec(parsed.entry, dict(resolved), parsed.given), fn))
    return Augment(ops) if ops else None


@register_op("none")
def _none_factory(ctx: AugmentContext):
    """No augmentation (dropped from the pipeline; a spec of only ``none`` gives ``None``)."""

    def fn(x, targets, g):
        return x, targets

    return fn
