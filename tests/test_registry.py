"""The one registry pattern (ddlib.specs.registry) and the one number parser."""

import pytest

from ddlib.specs.registry import Registry, parse_number


def test_parse_number_reads_what_params_files_write():
    assert parse_number("8/255") == 8 / 255 and parse_number(" 2/225 ") == 2 / 225
    assert parse_number("1e-3") == 0.001 and parse_number(3) == 3.0 and parse_number(0.5) == 0.5
    for bad, message in ((True, "must be a number"), ("8/0", "fraction like 8/255"), ("eight", "fraction like 8/255"),
                         (float("nan"), "finite"), ("inf", "finite"), ([1], "must be a number")):
        with pytest.raises(ValueError, match=message):
            parse_number(bad, "eps")


def test_a_factory_registers_once_and_its_keyword_only_parameters_are_the_spec():
    toys = Registry("toy")

    @toys.register("scale", list_param="factors")
    def scale(base, *, factor: float = 2.0, factors: list = (), name: str = "x"):
        return base * factor

    assert toys.names() == ["scale"] and "scale" in toys and toys.params("scale") == {"factor": 2.0, "factors": (),
                                                                                        "name": "x"}
    assert toys.create("scale", 3) == 6.0
    assert toys.create({"scale": {"factor": "1/2"}}, 3) == 1.5  # fractions for float parameters
    spec = toys.parse({"scale": [1, 2]})
    assert spec.params["factors"] == [1, 2] and spec.given == ("factors",)
    assert spec.describe() == "scale(factor=2.0, factors=[1, 2], name=x)"
    assert toys.parse("scale").describe() == toys.parse({"scale": {"factor": 2}}).describe()  # one canonical name
    with pytest.raises(ValueError, match=r"unknown toy 'shift'; known: scale"):
        toys.create("shift", 1)
    with pytest.raises(ValueError, match=r"toy 'scale': unknown parameter\(s\) \['fctor'\]; known: \['factor'"):
        toys.parse({"scale": {"fctor": 1}})
    with pytest.raises(ValueError, match=r"toy 'scale': factor must be a number"):
        toys.parse({"scale": {"factor": True}})
    with pytest.raises(ValueError, match="a toy must be a name or a one-key mapping"):
        toys.parse({"scale": {}, "other": {}})
    with pytest.raises(ValueError, match="already registered"):
        toys.add("scale", scale)
    with pytest.raises(TypeError, match="needs a default"):
        toys.add("bad", lambda *, k: k)


def test_a_spec_subclass_checks_and_writes_its_registry_values():
    """A registry whose values need their own checks or spelling (reuse keys written before the
    registry keep theirs) gives a Spec subclass; meta reads as attributes; a toy entry is removed."""
    from ddlib.specs.registry import Spec

    class Percent(Spec):
        @classmethod
        def check(cls, entry, key, value):
            if not 0 <= parse_number(value, key) <= 100:
                raise ValueError(f"{entry.kind} {entry.name!r}: {key} must be in [0, 100], got {value!r}")
            return int(value)

        def describe(self):
            return f"{self.name}[" + ",".join(f"{k}={v}%" for k, v in sorted(self.params.items())) + "]"

    knobs = Registry("knob", spec=Percent)
    knobs.add("dial", lambda *, b=50, a=10: a + b, unit="percent")
    spec = knobs.parse({"dial": {"a": "20"}})
    assert isinstance(spec, Percent) and spec.describe() == "dial[a=20%,b=50%]" and knobs.create(spec) == 70
    assert spec == knobs.parse({"dial": {"a": 20, "b": 50}}) and len({spec, knobs.parse({"dial": {"a": 20}})}) == 1
    assert knobs.entry("dial").unit == "percent"
    with pytest.raises(AttributeError, match="no 'colour'"):
        knobs.entry("dial").colour
    with pytest.raises(ValueError, match=r"knob 'dial': a must be in \[0, 100\]"):
        knobs.parse({"dial": {"a": 101}})
    with pytest.raises(ValueError, match="a knob spec .* given where a toy is expected"):
        Registry("toy").parse(spec)
    with pytest.raises(ValueError, match="a knob must be a name"):
        knobs.parse(3)
    knobs.remove("dial")
    knobs.remove("dial")  # gone: no error
    assert "dial" not in knobs and Registry("attack").kind == "attack"
