"""The docs' generated parts: each protocol page's header and parameter table, written from its spec.

``docs/protocols/<name>.md`` holds, between the two marker lines below, the protocol's title,
summary, revision, revision history, leaderboards and parameter table, all read from
``ddlib.protocols.spec.get_spec(name)``; the rest of the page (what a cell computes, deviations,
checks against published numbers) is written by hand. Two ways in, one function:

* an MkDocs hook (``hooks: [docs/gen.py]`` in mkdocs.yml): ``mkdocs build`` puts the spec's current
  block into every protocol page it renders (the files on disk are left alone) and adds a page for a
  protocol that has none, and includes files named by ``<!-- include: PATH -->`` lines;
* ``python docs/gen.py`` rewrites the files on disk (so GitHub shows the same tables);
  ``--check`` exits 1 naming every page that is stale.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BEGIN = "<!-- generated from the protocol's SPEC by docs/gen.py: edit the spec, not these lines -->"
END = "<!-- end of the generated part -->"
INCLUDE = re.compile(r"^<!-- include: (?P<path>\S+?)(?: section=(?P<section>[\w-]+))?(?: shift=(?P<shift>\d))? -->$", re.M)


def _specs():
    """The specs of ddlib's own protocols (not those of ``DDLIB_PROTOCOL_PATH``), in report order."""
    if str(ROOT) not in sys.path[:1]:
        sys.path.insert(0, str(ROOT))  # this checkout's ddlib, whatever is installed
    from ddlib.protocols.spec import all_specs

    return [spec for spec in all_specs() if spec.module.startswith("ddlib.protocols.")]


def _cell(text: str, code: bool = False) -> str:
    """Text for a table cell: pipes escaped, and outside code spans ``<`` and ``>`` (``<path>`` is no tag)."""
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if code else text.replace("<", "&lt;").replace(">", "&gt;")


def _default(value) -> str:
    import yaml

    if value is None:
        return "`null`"
    shown = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    shown = shown.removesuffix("\n...").removesuffix("...").strip()
    return f"`{_cell(shown, code=True)}`"


def block(spec) -> str:
    """The generated part of ``spec``'s page: title, summary, revision, history, boards, parameters."""
    lines = [BEGIN, f"# {spec.title}", "", f"`protocol: {spec.name}`: {_cell(spec.summary)}.", "",
             f"Module `{spec.module}`, notebook `notebooks/{spec.notebook}`, **revision {spec.revision}** (part of "
             "every reuse key and leaderboard row: results of two revisions are never pooled)."]
    if spec.history:
        lines += ["", "What each revision changed:", ""]
        lines += [f"- revision {_cell(entry)}" for entry in spec.history]
    lines += ["", "Leaderboards (`ddlib summary`, `ddlib export --board NAME`, the site):", ""]
    for board in spec.boards:
        label = f" ({board.label})" if board.label else ""
        score = ("" if not board.score else f", ranked by `{board.score}`{label}" if board.higher_is_better
                 else f", headlined by `{board.score}`{label}, lower is better (not ranked)")
        weight = f", weight `--{board.weight}`" if board.weight else ""
        lines.append(f"- `{board.name}`: {board.title}{score}{weight}")
    lines += ["", "## Parameters", "",
              "Every key a grid's `params:` or `grid:`, `ddlib score --param KEY=VALUE`, `ddlib.score(...)` or "
              "`papermill -p` can set (`papermill --help-notebook notebooks/" + spec.notebook + "` lists the same):", "",
              "| parameter | type | default | meaning |", "|---|---|---|---|"]
    for name, param in spec.params.items():
        lines.append(f"| `{name}` | {_cell(param.type_name)} | {_default(param.default)} | {_cell(param.help)} |")
    lines.append(END)
    return "\n".join(lines)


def page_path(name: str) -> Path:
    return DOCS / "protocols" / f"{name}.md"


def splice(text: str, generated: str) -> str:
    """``text`` with its generated part replaced (or put first where it has none)."""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        return head + generated + rest.split(END, 1)[1]
    return generated + "\n\n" + text


def write_pages(check: bool = False) -> list[str]:
    """Bring every protocol page on disk up to date with its spec; the names of those that were stale."""
    stale = []
    for spec in _specs():
        path = page_path(spec.name)
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        new = splice(old, block(spec))
        if new != old:
            stale.append(str(path.relative_to(ROOT)))
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(new, encoding="utf-8")
    return stale


def include(markdown: str) -> str:
    """Replace each ``<!-- include: PATH [section=NAME] [shift=N] -->`` line (PATH from the repository
    root) by the file, or by its part between ``<!-- section: NAME -->`` and ``<!-- end section: NAME -->``,
    its headings moved N levels down."""
    def one(match: re.Match) -> str:
        path = ROOT / match["path"]
        if not path.is_file():
            raise FileNotFoundError(f"docs: include of {match['path']}: no such file")
        text = path.read_text(encoding="utf-8")
        if match["section"]:
            start, end = f"<!-- section: {match['section']} -->", f"<!-- end section: {match['section']} -->"
            if start not in text or end not in text:
                raise ValueError(f"docs: include of {match['path']}: no section {match['section']!r}")
            text = text.split(start, 1)[1].split(end, 1)[0].strip("\n") + "\n"
        shift = int(match["shift"] or 0)
        if shift:
            text = re.sub(r"^(#{1,6}) ", lambda m: "#" * min(6, len(m[1]) + shift) + " ", text, flags=re.M)
        return text
    return INCLUDE.sub(one, markdown)


# --------------------------------------------------------------------------- MkDocs hook

_BLOCKS: dict[str, str] = {}


def on_files(files, config):
    """The spec's block for every protocol; a page for a protocol that has none."""
    from mkdocs.structure.files import File

    _BLOCKS.clear()
    for spec in _specs():
        uri = f"protocols/{spec.name}.md"
        _BLOCKS[uri] = block(spec)
        if files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, content=_BLOCKS[uri]))
    return files


def on_page_markdown(markdown, page, config, files):
    generated = _BLOCKS.get(page.file.src_uri)
    if generated is not None:
        markdown = splice(markdown, generated)
    return include(markdown)


if __name__ == "__main__":
    check = "--check" in sys.argv[1:]
    stale = write_pages(check=check)
    for path in stale:
        print(f"{'stale' if check else 'wrote'}: {path}")
    raise SystemExit(1 if check and stale else 0)
