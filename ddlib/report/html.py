"""Self-contained HTML pages (report cards, the leaderboard site): inline CSS, PNGs as data URIs,
and one small inline script that sorts a table by the column whose header is clicked. No server,
no network, nothing to install: a page opens from disk in any browser."""

from __future__ import annotations

import base64
import html
import io

import pandas as pd

__all__ = ["figure_png", "image_tag", "table_html", "page", "escape"]

escape = html.escape

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;
color:#1f2328;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #d0d7de;padding-bottom:.2em}
h3{font-size:1.05em}
table{border-collapse:collapse;margin:.6em 0 1em;font-size:.86em}
th,td{border:1px solid #d0d7de;padding:.28em .55em;text-align:left;vertical-align:top}
th{background:#f6f8fa}table.sortable th{cursor:pointer}table.sortable th:after{content:" \\2195";color:#8c959f}
caption{caption-side:bottom;text-align:left;color:#57606a;font-size:.92em;padding-top:.3em;max-width:1100px}
.notrun{background:#fff8c5;border:1px solid #d4a72c;padding:.5em .8em;border-radius:4px}
code,pre{background:#f6f8fa;border-radius:4px;font-size:.88em}code{padding:.1em .3em}pre{padding:.6em;overflow:auto}
.figs{display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start}.figs img{max-width:100%;border:1px solid #eaeef2}
.wide{overflow-x:auto;max-width:100%}.wide table{width:max-content}.wide th,.wide td{max-width:26em}
.muted{color:#57606a;font-size:.92em}nav a{margin-right:1em}
img.pixels{image-rendering:pixelated;min-width:240px;max-height:80vh;object-fit:contain}
img.setgrid{max-height:80vh;max-width:100%;width:auto;height:auto}
.headline{font-size:1.1em;margin:.4em 0 .8em;padding:.45em .8em;background:#ddf4ff;border:1px solid #54aeff;
border-radius:4px}
"""

SORT_SCRIPT = """
<script>
// Click a column header to sort by it (numbers by their leading value: "61.2 [58.0, 64.1]" sorts as 61.2).
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("thead th").forEach(function (th, column) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var ascending = th.getAttribute("data-order") !== "ascending";
      var key = function (row) {
        var text = row.cells[column] ? row.cells[column].textContent.trim() : "";
        var number = parseFloat(text);
        return isNaN(number) ? text.toLowerCase() : number;
      };
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        if (typeof x !== typeof y) { return typeof x === "number" ? -1 : 1; }
        return (x < y ? -1 : x > y ? 1 : 0) * (ascending ? 1 : -1);
      });
      rows.forEach(function (row) { body.appendChild(row); });
      table.querySelectorAll("thead th").forEach(function (other) { other.removeAttribute("data-order"); });
      th.setAttribute("data-order", ascending ? "ascending" : "descending");
    });
  });
});
</script>
"""


def figure_png(fig, dpi: int = 110) -> bytes:
    """A matplotlib figure as PNG bytes (the figure is closed: pages hold many)."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def image_tag(png: bytes | None = None, alt: str = "", src: str | None = None, pixels: bool = False,
              css: str = "") -> str:
    """An <img>: the PNG inline as a data URI, or ``src`` (a file beside the page); ``pixels``:
    small images (a set's 8x8 digits) drawn larger, pixel for pixel; ``css``: its class."""
    if src is None:
        src = "data:image/png;base64," + base64.b64encode(png or b"").decode()
    kind = f' class="{escape(" ".join(c for c in ("pixels" if pixels else "", css) if c))}"' if pixels or css else ""
    return f'<img src="{escape(src)}" alt="{escape(alt)}"{kind}>'


def table_html(table: pd.DataFrame, caption: str = "", sortable: bool = False, index: bool = False) -> str:
    """A table (cells escaped), optionally sortable, with a caption under it."""
    classes = "sortable" if sortable else ""
    text = table.to_html(index=index, escape=True, border=0, classes=classes or None, na_rep="")
    if caption:
        text = text.replace("<thead>", f"<caption>{escape(caption)}</caption>\n<thead>", 1)
    return f'<div class="wide">{text}</div>'  # a wide table scrolls inside the page, not the page


def page(title: str, body: str, sortable: bool = False) -> str:
    """A complete HTML document."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body>\n{body}\n"
            f"{SORT_SCRIPT if sortable else ''}</body></html>\n")
