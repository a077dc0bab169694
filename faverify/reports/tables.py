"""Text for the terminal and for GitHub-flavored Markdown: numbers formatted one way everywhere, tables, and
every string that comes from a kernel, an exception or a run file escaped on its way into Markdown.

A run file can come from anyone, and a kernel's name or its exception's message is the kernel author's text:
in Markdown such text must stay text. It is written on one line, with the punctuation that makes Markdown or
HTML of it escaped (a `|` would add a table column, `</details><script>` would be HTML, `[x](y)` a link, a
message holding a newline and `**PASS**` would forge a verdict line); code spans get a backtick fence longer
than any run inside them.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tabulate import tabulate

from faverify.errors import printable
from faverify.reports.results import num

TABLE_FORMAT = {"table": "simple", "md": "pipe"}  # pipe: alignment colons GitHub renders
_PUNCTUATION = re.compile(r"([\\`*\[\]<|])")


def fmt(x, spec: str = ".3g") -> str:
    v = num(x)
    if math.isnan(v):
        return "-"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return format(v, spec)


def ratio(x) -> str:
    v = num(x)
    return fmt(v, ".2f") if math.isnan(v) or math.isinf(v) or v < 1e4 else fmt(v, ".3g")


def share(part, whole) -> str:
    """The part of the allowed error that came from the floor, as a fraction ("-" where not recorded)."""
    p, w = num(part), num(whole)
    return fmt(p / w, ".2f") if w > 0 and not math.isnan(p) else "-"


def escape(text) -> str:
    """Text as Markdown text: one line, its punctuation backslash-escaped (and printable)."""
    one_line = " ".join(printable(text).split("\n"))
    return _PUNCTUATION.sub(r"\\\1", one_line)


def code(text) -> str:
    """A Markdown code span of text (one line, printable), fenced by more backticks than any run inside it."""
    one_line = " ".join(printable(text).split("\n"))
    longest = max((len(run) for run in re.findall(r"`+", one_line)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if one_line.startswith("`") or one_line.endswith("`") else ""
    return f"{fence}{pad}{one_line}{pad}{fence}"


@dataclass(frozen=True)
class Style:
    """How a report is written: "table" (the terminal) or "md" (GitHub Markdown)."""
    name: str

    @property
    def md(self) -> bool:
        return self.name == "md"

    def text(self, value) -> str:
        """Any string that is not the report's own: printable (errors.printable), and escaped in Markdown."""
        return escape(value) if self.md else printable(value)

    def code(self, value) -> str:
        return code(value) if self.md else printable(value)

    def bold(self, value: str) -> str:
        return f"**{value}**" if self.md else value

    def item(self, line: str) -> str:
        """A line of a list (already escaped where it must be)."""
        return f"- {line}" if self.md else line

    def heading(self, text: str, level: int = 2) -> str:
        return f"{'#' * level} {self.text(text)}" if self.md else f"== {self.text(text)} =="


def _numeric(cell: str) -> bool:
    if cell in ("-", "inf", "-inf", ""):
        return True
    try:
        float(cell)
        return True
    except ValueError:
        return False


def table(rows: list, headers: list, style: str) -> str:
    """Cells arrive formatted; columns whose cells are all numbers are right-aligned; every cell is printable
    text (errors.printable), in Markdown escaped."""
    if not rows:
        return "(none)"
    rows = [[printable(cell) for cell in r] for r in rows]
    align = ["right" if all(_numeric(str(r[i])) for r in rows) else "left" for i in range(len(headers))]
    if style == "md":
        rows = [[escape(cell) if not _numeric(str(cell)) else str(cell) for cell in r] for r in rows]
        headers = [escape(h) for h in headers]
    return tabulate(rows, headers=headers, tablefmt=TABLE_FORMAT[style], colalign=align, disable_numparse=True)
