"""The page machinery every report shares: a Jinja2 environment with autoescape on, figures embedded
as data URIs, pandas tables as HTML, and a section model the one page template renders.

A report is a title, a few header facts and a list of Sections; each Section holds Blocks (a paragraph,
a key/value list, a table, a figure, or a notice that something is missing). Everything a user or a run
supplies (model names, paths, error messages) goes through the template and is escaped there; the only
pre-built HTML is what pandas and matplotlib produce from our own data, marked safe on purpose.
"""
from __future__ import annotations

import base64
import datetime as _dt
import html as _html
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

TEMPLATES = Path(__file__).resolve().parent / "templates"
MAX_BYTES = 5 * 1024 * 1024   # a full H200 scan report must stay under this (issue: one mailable file)


def environment() -> Environment:
    # autoescape=True for every template whatever its extension: *.html.j2 would not match
    # select_autoescape's default list, and a report must never pass a run's strings through raw.
    return Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=True,
                       undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)


# ---- blocks ----------------------------------------------------------------------------------
@dataclass
class Block:
    kind: str                      # "p" | "kv" | "table" | "figure" | "missing" | "note" | "link" | "card"
    data: Any = None


@dataclass
class Section:
    id: str
    title: str
    blocks: list[Block] = field(default_factory=list)

    def p(self, text: str) -> "Section":
        self.blocks.append(Block("p", text))
        return self

    def note(self, text: str, level: str = "info") -> "Section":
        self.blocks.append(Block("note", {"text": text, "level": level}))
        return self

    def kv(self, items: dict[str, Any]) -> "Section":
        self.blocks.append(Block("kv", [(k, fmt_value(v)) for k, v in items.items()]))
        return self

    def table(self, df, caption: str | None = None, **kw) -> "Section":
        self.blocks.append(Block("table", {"html": df_html(df, **kw), "caption": caption}))
        return self

    def table_html(self, html: Markup, caption: str | None = None) -> "Section":
        self.blocks.append(Block("table", {"html": html, "caption": caption}))
        return self

    def figure(self, fig, alt: str, caption: str | None = None, fmt: str = "svg") -> "Section":
        self.blocks.append(Block("figure", embed_figure(fig, alt, caption, fmt)))
        return self

    def cells(self, columns: list[str], rows: list[list[tuple[Any, str]]], caption: str | None = None) -> "Section":
        """A table whose cells carry a CSS class (e.g. 'changed-up'): rendered by the template, so every
        cell and header is autoescaped."""
        self.blocks.append(Block("cells", {"columns": columns, "rows": rows, "caption": caption}))
        return self

    def card(self, tiles: list[tuple[str, Any, str]]) -> "Section":
        """An at-a-glance card: tiles of (label, value, how it was measured)."""
        self.blocks.append(Block("card", [(k, fmt_value(v) if v is not None else NOT_MEASURED, how)
                                          for k, v, how in tiles]))
        return self

    def link(self, href: str, text: str) -> "Section":
        self.blocks.append(Block("link", {"href": href, "text": text}))
        return self

    def missing(self, what: str, error: str | None = None) -> "Section":
        self.blocks.append(Block("missing", {"what": what, "error": error}))
        return self

    @property
    def is_missing(self) -> bool:
        return any(b.kind == "missing" for b in self.blocks)


NOT_MEASURED = "not measured in this scan"


def fmt_value(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt_value(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}: {fmt_value(x)}" for k, x in v.items())
    return str(v)


# ---- tables ----------------------------------------------------------------------------------
def df_html(df, float_format: str = "{:,.4g}", max_rows: int = 60, index: bool = False) -> Markup:
    """A DataFrame as an HTML table. pandas escapes every cell and header (escape=True); long tables
    are cut to `max_rows` with a final line saying how many rows were left out."""
    n = len(df)
    shown = df.head(max_rows) if n > max_rows else df
    # None in an object column prints as "None"; NaN prints as na_rep
    shown = shown.astype(object).where(shown.notna(), float("nan")) if len(shown) else shown
    html = shown.to_html(index=index, escape=True, border=0, classes="data", na_rep="–",
                         float_format=lambda x: float_format.format(x))
    if n > max_rows:
        html += f'<p class="more">{n - max_rows:,} more rows not shown (of {n:,}).</p>'
    return Markup(html)


# ---- figures ---------------------------------------------------------------------------------
def new_figure(width: float = 8.0, height: float = 4.0, **kw):
    """A matplotlib Figure that belongs to no pyplot state (the object API: nothing global to leak
    or to close), with an Agg canvas attached."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height), layout="constrained", **kw)
    FigureCanvasAgg(fig)
    return fig


def figure_bytes(fig, fmt: str = "svg", dpi: int = 100) -> bytes:
    if fmt not in ("svg", "png"):
        raise ValueError(f"figure format must be svg or png, not {fmt!r}")
    import matplotlib
    buf = io.BytesIO()
    # Text as paths (no font references an offline browser could miss) and no date/software stamp, so
    # the same run renders the same bytes. Figure.savefig picks the SVG or Agg canvas for the format.
    meta = {"Date": None} if fmt == "svg" else {"Software": None}
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "kog"}):
        fig.savefig(buf, format=fmt, dpi=dpi, metadata=meta)
    return buf.getvalue()


def embed_figure(fig, alt: str, caption: str | None = None, fmt: str = "svg", dpi: int = 100) -> dict:
    """A figure as a data URI for an <img>: each figure is its own document (no id clashes between
    inline SVGs), and nothing is fetched. Heatmaps and timelines go as PNG (fewer bytes than
    thousands of SVG paths); line charts as SVG (sharp at any zoom)."""
    data = figure_bytes(fig, fmt, dpi)
    mime = "image/svg+xml" if fmt == "svg" else "image/png"
    w, h = fig.get_size_inches()
    return {"src": f"data:{mime};base64,{base64.b64encode(data).decode()}", "alt": alt,
            "caption": caption, "width": int(w * 100), "height": int(h * 100), "bytes": len(data)}


# ---- pages -----------------------------------------------------------------------------------
def render_page(out: Path, title: str, subtitle: str | None, facts: dict[str, Any],
                sections: list[Section], kind: str, template: str = "report.html.j2",
                extra: dict[str, Any] | None = None) -> Path:
    """Render the sections into one self-contained HTML file, written atomically."""
    from kog.fsutil import atomic_write_bytes
    from kog import __version__
    page = environment().get_template(template).render(
        title=title, subtitle=subtitle, facts=[(k, fmt_value(v)) for k, v in facts.items()],
        sections=sections, kind=kind, kog_version=__version__,
        generated=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **(extra or {}))
    out = Path(out)
    atomic_write_bytes(out, page.encode("utf-8"))
    return out


def escape(s: Any) -> str:
    return _html.escape(str(s))


def table_or_none(run, name: str):
    """A run's table, or None when it is absent or unreadable: a report shows what is missing instead
    of failing."""
    if not run.has_table(name):
        return None
    try:
        return run.table(name)
    except Exception:
        return None


def corrupt_files(run) -> dict[str, str]:
    """{file name: why} for the run's files that are there but cannot be read (kog.runstore.Run.corrupt_files);
    empty for a bench JSON file read on its own."""
    fn = getattr(run, "corrupt_files", None)
    return fn() if callable(fn) else {}


def note_corrupt(sec: Section, run) -> dict[str, str]:
    """A warning in `sec` naming every corrupt file of the run (the sections below show them as missing)."""
    bad = corrupt_files(run)
    if bad:
        sec.note("Corrupt files in this run (they cannot be read; the sections that need them say so): "
                 + "; ".join(f"{n}: {why}" for n, why in bad.items()), "warn")
    return bad


def error_for(run, *names: str) -> str | None:
    """The error a run recorded (meta.json 'errors') for any of `names` (a probe or system name),
    matched loosely: 'signal' finds 'signal', 'probe:signal' or 'signal_latency'."""
    errors = (getattr(run, "meta", None) or {}).get("errors") or {}
    found = []
    for where, msg in errors.items():
        w = str(where).lower()
        if any(n.lower() in w or w in n.lower() for n in names):
            found.append(f"{where}: {msg}")
    return "; ".join(found) or None
