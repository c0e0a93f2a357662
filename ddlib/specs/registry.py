"""One registry pattern for every pluggable thing: models, datasets, augmentation ops, attacks,
adversarial objectives, soft-label losses, source kinds, set formats and protocols (as timm's
``_registry``).

A factory registers under a name with a decorator; its **keyword-only parameters with defaults
are its parameters** (what a params file may set, and nothing else), and any leading positional
parameters are the context the caller supplies (a model, the dataset's normalisation)::

    LOSSES = Registry("loss")

    @LOSSES.register("kl")
    def kl(*, temperature: float = 4.0, t_squared: bool = True): ...

    LOSSES.create("kl")                          # defaults
    LOSSES.create({"kl": {"temperature": 1}})    # a params-file spec: a name, or {name: {params}}

A spec is parsed once (:meth:`Registry.parse`: unknown names and parameters are refused, naming
the kind and the key; numbers may be written as fractions, ``8/255``, by :func:`parse_number`)
into a :class:`Spec`, whose :meth:`Spec.describe` is the canonical text of what runs (every
parameter, defaults included): the name a hook carries and the reuse key is derived from, so a
stale name can never travel beside a changed hook.

A registry whose values need more than the float rule, or whose canonical text is written another
way (reuse keys written before this module keep their spelling), gives a subclass of :class:`Spec`
that overrides :meth:`Spec.check` and sets how :meth:`Spec.spell` writes it (``Registry("attack",
spec=AttackSpec)``).
"""

from __future__ import annotations

import inspect
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Generic, Iterator, Mapping, TypeVar

from ddlib.specs.shown import shown

__all__ = ["Registry", "Entry", "Spec", "parse_number", "describe_value"]

T = TypeVar("T")


def parse_number(value: Any, what: str = "value") -> float:
    """A number as params files write it: an int or float (not a bool), or a string such as ``"8/255"``,
    ``"1e-3"`` or ``"0.5"``; finite. ``ValueError`` naming ``what`` otherwise. The one parser of
    such numbers in ddlib (attacks' ε, objectives' steps, losses' weights, augmentation params)."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number, got {shown(value)}")
    if isinstance(value, numbers.Real):
        number = float(value)
    elif isinstance(value, str):
        text = value.strip()
        num, slash, den = text.partition("/")
        try:
            number = float(num) / float(den) if slash else float(text)
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"{what} must be a number or a fraction like 8/255, got {shown(value)}") from None
    else:
        raise ValueError(f"{what} must be a number, got {shown(value)}")
    if not math.isfinite(number):
        raise ValueError(f"{what} must be finite, got {shown(value)}")
    return number


def describe_value(value: Any) -> str:
    """Compact, canonical text of a parameter value (MLflow params and reuse keys hold it)."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {describe_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(describe_value(v) for v in value) + "]"
    return str(value)


@dataclass(frozen=True)
class Entry:
    """A registered factory: its name, parameter defaults and free-form metadata (``meta``, also
    readable as attributes: ``entry.norm`` is ``entry.meta["norm"]``)."""

    kind: str
    name: str
    factory: Callable
    defaults: dict
    meta: dict = field(default_factory=dict)
    list_param: str | None = None  # a spec may give this one parameter as a bare list: {name: [...]}

    def __getattr__(self, key: str) -> Any:
        meta = self.__dict__.get("meta", {})
        if key in meta:
            return meta[key]
        raise AttributeError(f"{self.kind} {self.__dict__.get('name')!r} has no {key!r}")


@dataclass(frozen=True, eq=False)
class Spec:
    """A parsed spec: the entry's name and its parameters, defaults filled in (``given`` says which
    the spec set). Equal and hashed through its kind and :meth:`describe`.

    :meth:`spell` is the one writer of a spec's text; a registry whose reuse keys were spelled before
    this module keeps that spelling with the four class attributes below and :meth:`show`."""

    entry: Entry
    params: dict
    given: tuple[str, ...] = ()

    sorted_params: ClassVar[bool] = False  # parameters in name order (else in signature order)
    separator: ClassVar[str] = ", "
    bare_name: ClassVar[bool] = True  # no parameters: ``name`` (else ``name()``)

    @property
    def name(self) -> str:
        """The entry's registered name, which the spec's canonical text starts with."""
        return self.entry.name

    @classmethod
    def check(cls, entry: Entry, key: str, value: Any) -> Any:
        """A value a spec gives for ``key``, checked and converted. Here: numeric parameters (whose
        default is a float) read numbers and fractions, never a bool; others are taken as given."""
        if isinstance(entry.defaults[key], float):
            return parse_number(value, f"{entry.kind} {entry.name!r}: {key}")
        return value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Spec) and (self.entry.kind, self.describe()) == (other.entry.kind, other.describe())

    def __hash__(self) -> int:
        return hash((self.entry.kind, self.describe()))

    @classmethod
    def show(cls, key: str, value: Any) -> str:
        """One parameter's value as the text writes it (here :func:`describe_value`)."""
        return describe_value(value)

    @classmethod
    def spell(cls, name: str, params: Mapping[str, Any], more: Mapping[str, Any] | None = None) -> str:
        """``name`` or ``name(k=v, ...)``: ``params`` as the class orders and shows them, then ``more``
        (appended as given: a loss's ``targets_are_logits``)."""
        items = [*(sorted(params.items()) if cls.sorted_params else params.items()), *(more or {}).items()]
        if not items and cls.bare_name:
            return name
        return f"{name}(" + cls.separator.join(f"{k}={cls.show(k, v)}" for k, v in items) + ")"

    def describe(self) -> str:
        """The canonical text of what runs: every parameter, defaults included (:meth:`spell`)."""
        return self.spell(self.name, self.params)

    def __str__(self) -> str:
        return self.describe()


class Registry(Generic[T]):
    """Names to factories of one ``kind`` (the word error messages use: "attack", "loss", ...)."""

    def __init__(self, kind: str, *, spec: type[Spec] = Spec):
        self.kind = kind
        self.spec_type = spec  # what parse() returns: a subclass checks values and writes them its way
        self._entries: dict[str, Entry] = {}

    # ------------------------------------------------------------------ registration

    def register(self, name: str | None = None, *, list_param: str | None = None, **meta) -> Callable:
        """Decorator: register ``factory(*context, *, param=default, ...)`` under ``name`` (default: its
        ``__name__``). Its keyword-only parameters, each with a default, are the spec's parameters."""

        def decorate(factory: Callable) -> Callable:
            self.add(name or factory.__name__, factory, list_param=list_param, **meta)
            return factory

        return decorate

    def add(self, name: str, factory: Callable, *, list_param: str | None = None, defaults: dict | None = None,
            **meta) -> Entry:
        """Register without a decorator; ``defaults`` replaces the signature's (for factories that
        wrap a class whose parameters are not keyword-only, e.g. a torchattacks attack)."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        if defaults is None:
            defaults = {}
            for p in inspect.signature(factory).parameters.values():
                if p.kind is inspect.Parameter.KEYWORD_ONLY:
                    if p.default is inspect.Parameter.empty:
                        raise TypeError(f"{self.kind} {name!r}: keyword-only parameter {p.name!r} needs a default")
                    defaults[p.name] = p.default
        if list_param is not None and list_param not in defaults:
            raise TypeError(f"{self.kind} {name!r}: list_param {list_param!r} is not a parameter")
        entry = Entry(self.kind, name, factory, dict(defaults), dict(meta), list_param)
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> None:
        """Unregister ``name`` (a test's toy entry); no error if it is not there."""
        self._entries.pop(name, None)

    # ------------------------------------------------------------------ lookup

    def names(self) -> list[str]:
        """Every registered name, sorted: what ``list_*`` functions and unknown-name errors show."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, name: str) -> Entry:
        """The entry of ``name``; an unknown name is a ValueError listing the known ones."""
        if not isinstance(name, str) or name not in self._entries:
            raise ValueError(f"unknown {self.kind} {shown(name)}; known: {', '.join(self.names())}")
        return self._entries[name]

    def params(self, name: str) -> dict:
        """The parameters of ``name`` with their defaults."""
        return dict(self.entry(name).defaults)

    # ------------------------------------------------------------------ specs

    def parse(self, spec: "str | Mapping[str, Any] | Spec") -> Spec:
        """``"name"`` or ``{name: {params}}`` (``{name: [..]}`` for a list parameter) -> a :class:`Spec`
        with every default filled in. Unknown names and parameters are refused naming the key;
        numeric parameters whose default is a float accept fractions (``8/255``)."""
        if isinstance(spec, Spec):
            if spec.entry.kind != self.kind:
                raise ValueError(f"a {spec.entry.kind} spec ({spec.describe()}) given where a {self.kind} is expected")
            return spec
        if isinstance(spec, str):
            name, given = spec, {}
        elif isinstance(spec, Mapping) and len(spec) == 1:
            ((name, given),) = spec.items()
            entry = self.entry(name)
            if given is None:
                given = {}
            elif isinstance(given, (list, tuple)) and entry.list_param is not None:
                given = {entry.list_param: list(given)}
            elif not isinstance(given, Mapping):
                raise ValueError(f"{self.kind} {name!r}: parameters must be a mapping, got {shown(given)}")
        else:
            article = "an" if self.kind[:1] in "aeiou" else "a"
            raise ValueError(f"{article} {self.kind} must be a name or a one-key mapping {{name: {{params}}}}, "
                             f"got {shown(spec)}")
        entry = self.entry(name)
        unknown = sorted(str(k) for k in given if k not in entry.defaults)
        if unknown:
            raise ValueError(f"{self.kind} {name!r}: unknown parameter(s) {unknown}; known: {sorted(entry.defaults)}")
        params = dict(entry.defaults)
        for key, value in given.items():
            params[key] = self.spec_type.check(entry, key, value)
        return self.spec_type(entry, params, tuple(given))

    def create(self, spec: "str | Mapping[str, Any] | Spec", *context: Any) -> T:
        """Parse ``spec`` and call its factory with ``context`` and the parameters."""
        parsed = self.parse(spec)
        return parsed.entry.factory(*context, **parsed.params)
