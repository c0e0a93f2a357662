"""The one registry pattern (ddlib.registry) and the one number parser."""

import pytest

from ddlib.registry import Registry, parse_number


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
