"""Mermaid charts for the Markdown reports: an `xychart-beta` block is text that GitHub draws, so a
pull-request comment gets pictures without a plotting dependency. xychart has no legend: a chart with
several lines names them, in order, in its title."""
from __future__ import annotations

import math

from faverify.reports.results import num as _num


def _quoted(text: str) -> str:
    """A label, quoted for Mermaid, on one line and without backticks: nothing in it can end the fence."""
    return '"' + " ".join(str(text).split()).replace('"', "'").replace("`", "'") + '"'


def _values(series: list) -> str:
    return "[" + ", ".join(f"{v:.4g}" if v == v and math.isfinite(v) else "0" for v in map(_num, series)) + "]"


def xychart(title: str, x_labels: list, y_label: str, y_max: float, *, bars: tuple = (), lines: tuple = ()) -> str:
    """One fenced block: categories on x, each series one value per category (missing values drawn as 0)."""
    for series in (*bars, *lines):
        if len(series) != len(x_labels):
            raise ValueError(f"a series has {len(series)} values for {len(x_labels)} categories")
    body = ["```mermaid", "xychart-beta", f"    title {_quoted(title)}",
            "    x-axis [" + ", ".join(_quoted(x) for x in x_labels) + "]",
            f"    y-axis {_quoted(y_label)} 0 --> {y_max:.3g}"]
    body += [f"    bar {_values(b)}" for b in bars] + [f"    line {_values(line)}" for line in lines]
    return "\n".join(body + ["```"])


def margin_chart(rows: list) -> str:
    """Per tensor (stats rows of a run), the largest err/allowed as a bar, the median as a line and the limit
    1 as a line: how much margin the kernel has, at a glance. "" when no row has a value."""
    rows = [r for r in rows if _num(r.get("usage_max")) == _num(r.get("usage_max"))]
    if not rows:
        return ""
    several = len({r["kernel"] for r in rows}) > 1
    names = [(f"{r['kernel']} " if several else "") + f"{r['dtype']} {r['tensor']}" for r in rows]
    top = max(1.2, 1.1 * max(_num(r["usage_max"]) for r in rows))
    return xychart("err / allowed per tensor: bar the largest, lines the median and the limit 1", names,
                   "err / allowed", top, bars=([r["usage_max"] for r in rows],),
                   lines=([r.get("usage_p50") for r in rows], [1.0] * len(rows)))


def tflops_charts(rows: list) -> list:
    """Bench rows: per dtype, head dim, causal, variant and direction, TF/s against seqlen, a line per kernel."""
    def group(r) -> tuple:
        return r["dtype"], r["head_dim"], bool(r["causal"]), r.get("variant", "dense")

    charts = []
    for dtype, d, causal, variant in sorted(set(map(group, rows))):
        mine = [r for r in rows if group(r) == (dtype, d, causal, variant)]
        seqlens = sorted({r["seqlen"] for r in mine})
        kernels = list(dict.fromkeys(r["kernel"] for r in mine))
        for mode in ("fwd", "bwd"):
            key = f"{mode}_tflops"
            if not any(_num(r.get(key)) > 0 for r in mine):
                continue
            at = {(r["kernel"], r["seqlen"]): _num(r.get(key)) for r in mine}
            lines = [[at.get((k, s), math.nan) for s in seqlens] for k in kernels]
            top = max(v for line in lines for v in line if v == v)
            shape = f"{dtype} d{d} {'causal' if causal else 'full'}" + ("" if variant == "dense" else f" {variant}")
            title = f"{mode} TF/s, {shape}; lines: " + ", ".join(kernels)
            charts.append(xychart(title, [str(s) for s in seqlens], "TF/s", 1.1 * top, lines=tuple(lines)))
    return charts
