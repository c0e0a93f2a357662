"""The README a newcomer reads, and the docs site for the rest (issue 24.12).

The site builds with ``mkdocs build --strict`` (every warning an error: a broken link or anchor, a
page missing from the nav, a missing include); every protocol has a page whose parameter table,
generated from its spec, lists every parameter; the pages on disk carry the same generated part
(what GitHub shows); the README stays short and links into the docs."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddlib.protocols.spec import all_specs

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250


def _ddlib_specs():
    return [spec for spec in all_specs() if spec.module.startswith("ddlib.protocols.")]


def _mkdocs() -> list[str]:
    exe = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    if exe is None:
        pytest.skip("mkdocs is not installed (the test extra pins it: pip install -e '.[test]')")
    return [exe]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs-site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    env.pop("DDLIB_PROTOCOL_PATH", None)
    done = subprocess.run(_mkdocs() + ["build", "--strict", "--site-dir", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def _table_params(page: str) -> list[str]:
    """The parameter names of the first table whose header starts with "parameter" in a built page."""
    tables = re.findall(r"<table>(.*?)</table>", page, re.S)
    for table in tables:
        header = re.search(r"<thead>(.*?)</thead>", table, re.S)
        if header and re.sub(r"<[^>]+>", "", header.group(1)).split()[:1] == ["parameter"]:
            body = re.search(r"<tbody>(.*?)</tbody>", table, re.S).group(1)
            rows = re.findall(r"<tr>\s*<td>(.*?)</td>", body, re.S)
            return [html.unescape(re.sub(r"<[^>]+>", "", cell)).strip() for cell in rows]
    return []


def test_site_builds_strict_and_every_protocol_page_lists_every_parameter(site):
    for spec in _ddlib_specs():
        page = site / "protocols" / spec.name / "index.html"
        assert page.is_file(), f"no docs page for protocol {spec.name}"
        text = page.read_text(encoding="utf-8")
        listed = _table_params(text)
        assert listed == list(spec.params), f"{spec.name}: the page lists {listed}, the spec has {list(spec.params)}"
        assert f"revision {spec.revision}" in text
        for param in spec.params.values():  # the help text as the spec says it
            assert html.escape(param.help.split(" (")[0], quote=False) in text, (spec.name, param.help)


def test_protocol_pages_on_disk_carry_the_generated_part():
    """What GitHub shows is what the site shows: ``python docs/gen.py`` has been run after the last
    change of a spec."""
    done = subprocess.run([sys.executable, "docs/gen.py", "--check"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, f"stale protocol pages (run python docs/gen.py):\n{done.stdout}{done.stderr}"


def test_demo_numbers_come_from_the_script(site):
    numbers = (ROOT / "docs" / "numbers" / "demo.md").read_text(encoding="utf-8")
    assert numbers.startswith("<!-- written by bench/docs_numbers.py")
    assert re.search(r"Measured \d{4}-\d\d-\d\d on .+, \d+ cores", numbers), "the machine and date of the run"
    for ipc in (1, 10):
        assert re.search(rf"^\| {ipc} \| dm \| 3 \|", numbers, re.M), f"the demo's DM row at IPC {ipc}"
    started = (site / "getting-started" / "index.html").read_text(encoding="utf-8")
    assert "acc_syn_hard" in started and "dm_kcenter" in started  # the table is included, not typed


def _rows(text: str) -> dict[tuple[str, str], list[str]]:
    """(ipc, method) -> the cells of a pipe table's rows."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) > 3 and cells[0].isdigit():
            out[(cells[0], cells[1])] = cells
    return out


def test_readme_demo_rows_are_the_scripts():
    """The README's excerpt is written by bench/docs_numbers.py from the run of docs/numbers/demo.md."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    begin, end = "<!-- demo excerpt: written by bench/docs_numbers.py", "<!-- end of the demo excerpt -->"
    assert begin in readme and end in readme
    excerpt = _rows(readme.split(begin, 1)[1].split(end, 1)[0])
    demo = _rows((ROOT / "docs" / "numbers" / "demo.md").read_text(encoding="utf-8"))
    assert excerpt, "the README's demo excerpt is empty (run python bench/docs_numbers.py)"
    for key, cells in excerpt.items():  # ipc, method, rank, acc_syn_hard, HLR, IOR, LRS
        full = demo[key]  # ipc, method, seeds, rank, tied with, acc_syn_hard, acc_real_hard, acc_rdm_any, HLR, IOR, LRS
        assert [cells[2], cells[3], *cells[4:7]] == [full[3], full[5], *full[8:11]], key


def test_readme_is_short_and_links_into_the_docs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < README_MAX_LINES
    for command in ("make demo", "make test", "ddlib score", "ddlib.score(", "ddlib summary", "ddlib ui",
                    "ddlib leaderboard", "ddlib report"):
        assert command in readme, command
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)\s]*)?\)", readme)
    assert len(set(links)) >= 8
    for link in links:
        assert (ROOT / link).is_file(), f"README links to {link}, which does not exist"
    for spec in _ddlib_specs():
        assert f"docs/protocols/{spec.name}.md" in links, f"README does not link the {spec.name} page"


def _section(page: str, heading: str) -> str:
    """The text of a ``## heading`` section of a docs page, up to the next ``## ``."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    assert f"\n## {heading}\n" in text, f"docs/{page} has no section {heading!r}"
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_shipped_grids_table_lists_every_shipped_grid():
    """Every params/*.yaml is in the table of docs/running-grids.md (privacy_demo, blackbox_digits and
    digits_curves were missing), and the table names no file that is not shipped."""
    table = [line for line in _section("running-grids.md", "The shipped grids").splitlines() if line.startswith("| `")]
    listed = [name for line in table for name in re.findall(r"`([\w.-]+\.yaml)`", line.split("|")[1])]
    shipped = sorted(p.name for p in (ROOT / "params").glob("*.yaml"))
    assert sorted(listed) == shipped, f"listed {sorted(listed)}, shipped {shipped}"


def test_own_grid_walkthrough_makes_a_set_and_a_grid_that_validate(tmp_path, monkeypatch):
    """The walkthrough's two files, as a reader copies them: its script writes the set, and its params
    file loads, expands to the cells it says and finds the set (what `ddlib run GRID --dry-run` checks
    before it estimates anything)."""
    import yaml

    from ddlib.run.runner import check_cell_inputs, expand, load_grid

    walkthrough = _section("running-grids.md", "Your own grid, step by step")
    script = re.search(r"```python\n(.*?)```", walkthrough, re.S).group(1)
    grid_text = re.search(r"```yaml\n(.*?)```", walkthrough, re.S).group(1)
    commands = re.search(r"```bash\n(.*?)```", walkthrough, re.S).group(1)
    grid_file = re.search(r"`([\w-]+\.yaml)`", walkthrough).group(1)
    for command in ("ddlib run {} --dry-run", "ddlib run {}", "ddlib summary", "ddlib report --method"):
        assert command.format(grid_file) in commands, command
    monkeypatch.chdir(tmp_path)
    exec(compile(script, "make_set.py", "exec"), {"__name__": "__main__"})
    (tmp_path / grid_file).write_text(grid_text)
    spec = load_grid(grid_file)
    cells = expand(spec)
    raw = yaml.safe_load(grid_text)
    assert sorted(c["method"] for c in cells) == sorted(raw["grid"]["method"])
    assert any(source.get("kind") == "file" for source in raw["methods"].values())  # a set of one's own
    check_cell_inputs(spec, cells)  # the set is read and checked against the dataset
