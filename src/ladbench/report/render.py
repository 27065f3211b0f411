"""A table as data (cells with estimate, spread and confidence interval) and its
renderings: Markdown (reading), CSV (one number per column, for analysis), LaTeX
(booktabs, for papers) and HTML (for the ``snakemake --report`` page).

A :class:`Table` is a list of :class:`Block` s that share one header, e.g. one block
per dataset and N in Table 1. A missing value is a :class:`Cell` with ``value=None``
and renders as "–".
"""

from __future__ import annotations

import csv
import html
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence, Union

from ladbench.atomic import replacing_together

__all__ = ["MISSING", "Block", "Cell", "Table", "to_csv", "to_html", "to_latex", "to_markdown", "write_table"]

MISSING = "–"


def _is_number(value) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


@dataclass(frozen=True)
class Cell:
    """One number of a table: estimate, optional ± spread, optional [low, high] interval,
    optional note (e.g. the parse success of a generative method)."""

    value: float | None = None
    std: float | None = None
    low: float | None = None
    high: float | None = None
    note: str = ""
    digits: int = 2

    @property
    def ci_digits(self) -> int:
        """Intervals get one decimal less than the estimate (at least one)."""
        return max(1, self.digits - 1)

    @property
    def missing(self) -> bool:
        return not _is_number(self.value)

    def text(self, plus_minus: str = "±", interval: str = "[{}, {}]", note: str = "({})",
             escape: Callable[[str], str] = str) -> str:
        """``51.70±1.38 [49.9, 53.5]``; "–" when the value is missing. The separators and
        wrappers are parameters so that LaTeX (``_latex_entry``) reuses the same layout."""
        if self.missing:
            return MISSING
        out = f"{self.value:.{self.digits}f}"
        if _is_number(self.std):
            out += f"{plus_minus}{self.std:.{self.digits}f}"
        if _is_number(self.low) and _is_number(self.high):
            out += " " + interval.format(f"{self.low:.{self.ci_digits}f}", f"{self.high:.{self.ci_digits}f}")
        if self.note:
            out += " " + note.format(escape(self.note))
        return out


Entry = Union[str, Cell]


@dataclass
class Block:
    """Rows under a title; the header is the table's."""

    title: str
    rows: list[list[Entry]] = field(default_factory=list)


@dataclass
class Table:
    """A table in a paper's layout: a name (file stem), a title, notes saying what the
    columns mean, a header and blocks of rows."""

    name: str
    title: str
    header: list[str]
    blocks: list[Block]
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for block in self.blocks:
            for row in block.rows:
                if len(row) != len(self.header):
                    raise ValueError(
                        f"table {self.name}, block {block.title!r}: row {row} has {len(row)} entries, "
                        f"header has {len(self.header)}"
                    )


def _entry_text(entry: Entry) -> str:
    return entry.text() if isinstance(entry, Cell) else str(entry)


# --------------------------------------------------------------------------- Markdown


def _markdown_escape(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(table: Table) -> str:
    """The table as Markdown: a title, its notes, one pipe table per block."""
    lines = [f"# {table.title}", ""]
    lines += [f"{note}" for note in table.notes]
    if table.notes:
        lines.append("")
    if not any(block.rows for block in table.blocks):
        lines += ["No input for this table in this study (see the notes above).", ""]
    for block in table.blocks:
        if not block.rows:
            continue
        if block.title:
            lines += [f"## {block.title}", ""]
        lines.append("| " + " | ".join(_markdown_escape(h) for h in table.header) + " |")
        lines.append("|" + "---|" * len(table.header))
        for row in block.rows:
            lines.append("| " + " | ".join(_markdown_escape(_entry_text(e)) for e in row) + " |")
        lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- CSV


def _cell_columns(table: Table) -> list[bool]:
    """Which header columns hold numbers (a Cell in any row)."""
    return [
        any(isinstance(row[j], Cell) for block in table.blocks for row in block.rows)
        for j in range(len(table.header))
    ]


def _number(value) -> str:
    return f"{value:.6g}" if _is_number(value) else ""


def to_csv(table: Table) -> str:
    """One row per table row; a number column expands to value, std, CI low, CI high
    and note; missing numbers are empty fields. The first column is the block title."""
    numeric = _cell_columns(table)
    header = ["block"]
    for name, is_cell in zip(table.header, numeric):
        header += [name, f"{name} std", f"{name} ci_low", f"{name} ci_high", f"{name} note"] if is_cell else [name]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for block in table.blocks:
        for row in block.rows:
            fields = [block.title]
            for entry, is_cell in zip(row, numeric):
                if not is_cell:
                    fields.append(_entry_text(entry))
                elif isinstance(entry, Cell):
                    fields += [_number(entry.value), _number(entry.std), _number(entry.low), _number(entry.high), entry.note]
                else:  # a label in a numeric column (e.g. "–" written as text)
                    fields += ["", "", "", "", _entry_text(entry)]
            writer.writerow(fields)
    return buffer.getvalue()


# --------------------------------------------------------------------------- LaTeX

_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
_LATEX_UNICODE = {"±": r"$\pm$", "–": "--", "→": r"$\rightarrow$", "τ": r"$\tau$", "ρ": r"$\rho$", "≈": r"$\approx$",
                  "|": r"$|$", "×": r"$\times$", "≤": r"$\le$", "≥": r"$\ge$"}


def latex_escape(text: str) -> str:
    """Escape LaTeX's special characters and map the few non-ASCII symbols the tables use."""
    out = "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)
    return "".join(_LATEX_UNICODE.get(ch, ch) for ch in out)


def _latex_entry(entry: Entry) -> str:
    if not isinstance(entry, Cell) or entry.missing:
        return latex_escape(_entry_text(entry))
    return entry.text(plus_minus=r"$\pm$", interval=r"{{\scriptsize[{}, {}]}}", note=r"{{\scriptsize({})}}",
                      escape=latex_escape)


def to_latex(table: Table) -> str:
    """A booktabs ``table`` environment: the blocks separated by rules, each titled."""
    width = len(table.header)
    lines = [
        f"% {table.title}",
        *(f"% {note}" for note in table.notes),
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        rf"\caption{{{latex_escape(table.title)}}}",
        rf"\label{{tab:{table.name}}}",
        rf"\begin{{tabular}}{{{'l' * width}}}",
        r"\toprule",
        " & ".join(latex_escape(h) for h in table.header) + r" \\",
    ]
    for block in table.blocks:
        if not block.rows:
            continue
        lines.append(r"\midrule")
        if block.title:
            lines.append(rf"\multicolumn{{{width}}}{{l}}{{\textit{{{latex_escape(block.title)}}}}} \\")
        lines += [" & ".join(_latex_entry(e) for e in row) + r" \\" for row in block.rows]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- HTML


def to_html(table: Table) -> str:
    """A standalone HTML page (for ``snakemake --report``, which embeds HTML as it is)."""
    lines = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8">',
        f"<title>{html.escape(table.title)}</title>",
        "<style>body{font-family:sans-serif;font-size:14px} table{border-collapse:collapse;margin-bottom:1.5em}"
        " th,td{border-bottom:1px solid #ccc;padding:3px 8px;text-align:left} th{background:#f2f2f2}"
        " p.note{color:#444;max-width:70em}</style>",
        "</head><body>",
        f"<h1>{html.escape(table.title)}</h1>",
    ]
    lines += [f'<p class="note">{html.escape(note)}</p>' for note in table.notes]
    if not any(block.rows for block in table.blocks):
        lines.append("<p>No input for this table in this study (see the notes above).</p>")
    for block in table.blocks:
        if not block.rows:
            continue
        if block.title:
            lines.append(f"<h2>{html.escape(block.title)}</h2>")
        lines.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in table.header) + "</tr>")
        for row in block.rows:
            lines.append("<tr>" + "".join(f"<td>{html.escape(_entry_text(e))}</td>" for e in row) + "</tr>")
        lines.append("</table>")
    lines.append("</body></html>")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- files

RENDERERS = {".md": to_markdown, ".csv": to_csv, ".tex": to_latex, ".html": to_html}
#: the table formats, named by their file suffixes
TABLE_FORMATS = tuple(suffix[1:] for suffix in RENDERERS)


def write_table(table: Table, outputs: Sequence[str | Path]) -> None:
    """Write the table to each output, the format chosen by its suffix (.md, .csv, .tex, .html)."""
    write_tables([(table, outputs)])


def write_tables(tables: Sequence[tuple[Table, Sequence[str | Path]]]) -> None:
    """Write each table to its outputs (format by suffix), all files replaced as one set
    (:func:`ladbench.atomic.replacing_together`): a killed report never leaves old tables
    beside new ones."""
    files = [(path, table) for table, outputs in tables for path in outputs]
    for path, _ in files:
        if Path(path).suffix not in RENDERERS:
            raise ValueError(f"table output {path}: unknown format {Path(path).suffix!r}; use one of "
                             f"{sorted(RENDERERS)}")
    with replacing_together([path for path, _ in files]) as temporaries:
        for tmp, (path, table) in zip(temporaries, files):
            tmp.write_text(RENDERERS[Path(path).suffix](table), encoding="utf-8")
