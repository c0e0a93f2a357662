"""The public API reads like kornia's and timm's: ``ddlib.score``, ``create_model``, ``create_attack`` and
``load_dataset`` each document every argument, what they return and an example, and the examples run."""

import doctest
import inspect
import re
import sys

import pytest

import ddlib
from ddlib.attacks.catalog import create_attack
from ddlib.data.datasets import load_dataset
from ddlib.models._registry import create_model
from ddlib.protocols import PROTOCOLS

PUBLIC = [ddlib.score, create_model, create_attack, load_dataset]


def _section(doc: str, title: str) -> str:
    """The indented lines under ``title:`` up to the next blank-line-separated section."""
    match = re.search(rf"^    {title}:\n((?:        .*\n|\n(?=        ))+)", doc, re.M)
    return match.group(1) if match else ""


@pytest.mark.parametrize("fn", PUBLIC, ids=lambda fn: fn.__name__)
def test_each_documents_every_argument_its_return_and_an_example(fn):
    doc = fn.__doc__
    summary = doc.strip().splitlines()[0]
    assert summary.endswith(".") and len(summary) <= 100, summary
    args = _section(doc, "Args")
    named = set(re.findall(r"^        (\**\w+):", args, re.M))
    expected = {("**" if p.kind is p.VAR_KEYWORD else "") + name for name, p in inspect.signature(fn).parameters.items()}
    assert named == expected, f"Args: {sorted(named ^ expected)}"
    assert _section(doc, "Returns")
    assert ">>> " in doc or "Example::" in doc


def test_score_names_every_protocol_the_command_line_knows():
    for name in PROTOCOLS:
        assert f"``{name}``" in ddlib.score.__doc__, name


@pytest.mark.parametrize("fn", [fn for fn in PUBLIC if ">>> " in fn.__doc__], ids=lambda fn: fn.__name__)
def test_the_examples_run(fn):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in doctest.DocTestFinder().find(fn, fn.__name__, globs=dict(vars(sys.modules[fn.__module__]))):
        runner.run(test)
    results = runner.summarize(verbose=False)
    assert results.attempted > 0 and results.failed == 0
