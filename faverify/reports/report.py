"""Render a run as terminal tables or GitHub-flavored Markdown (pipe tables, numbers right-aligned). Every
string a run file carries is escaped on its way into Markdown (tables.py says why)."""
from __future__ import annotations

import math

from faverify.cases.case import Case
from faverify.cases.edges import EDGE_FLOOR
from faverify.cases.vocabulary import REGIMES_ALL
from faverify.dtypes import UNIT_ROUNDOFF
from faverify.env import header_lines
from faverify.reports.charts import margin_chart
from faverify.reports.collector import REPLAY_PASSED, Failure
from faverify.reports.plot import refusal as plot_refusal
from faverify.reports.results import Run
from faverify.reports.tables import Style, fmt, num, ratio, share, table

__all__ = ["METRIC_HEADERS", "RATIO_NOTE", "failure_block", "metrics_rows", "render", "table", "fmt", "ratio"]


def _below_one_rounding(m: dict, dtype: str | None) -> bool:
    """The baseline was more exact than one rounding of the tensor's terms: the ratio is against that."""
    return dtype in UNIT_ROUNDOFF and num(m["baseline_max_abs"]) < UNIT_ROUNDOFF[dtype] * num(m.get("scale"))


def metrics_rows(metrics: dict, dtype: str | None = None) -> list:
    """One row per tensor. With the case's dtype, a ratio against one rounding rather than the baseline's
    error is marked * (RATIO_NOTE)."""
    rows = []
    for t, m in metrics.items():
        m = m if isinstance(m, dict) else m.to_dict()
        mark = "*" if _below_one_rounding(m, dtype) else ""
        rows.append([t, fmt(m["max_abs"]), fmt(m["baseline_max_abs"]), ratio(m["ratio"]) + mark, fmt(m["allowed"]),
                     share(m.get("floor"), m["allowed"]),
                     fmt(m["max_ulp"], ".3g"), str(m["nan"]), str(m["inf"]), str(m["masked_bad"]),
                     str(m["worst_index"]),
                     ("pass" if m["passed"] else "FAIL") + (" (waived: ill-conditioned)" if m["waived"] else "")])
    return rows


METRIC_HEADERS = ["tensor", "max err", "baseline err", "ratio", "allowed", "floor share", "max ulp", "nan", "inf",
                  "masked bad", "worst index", "verdict"]
RATIO_NOTE = ("ratio: max err over the naive same-dtype attention's, or over one rounding of the tensor's terms "
              "(u(dtype) x scale_T) where the baseline is more exact than that (marked *); ulps are counted at the "
              "larger of each value and the tensor's typical magnitude scale_T, so values near 0 do not inflate them")


def failure_block(f: Failure, style: str) -> str:
    st = Style(style)
    m = f.minimal
    companions = f"; with it on the same cases: {', '.join(f.companions)}" if f.companions else ""
    lines = [st.text(f"{f.kernel}: {f.signature} ({f.occurrences} case(s); shrunk in {f.shrink_steps} steps)"
                     + (f"; {f.note}" if f.note else "") + companions),
             st.text(f"minimal case: {m.case.short()}"),
             st.text(f"reason: {m.reason}")]
    replayed = Case.from_json(f.sequence) if f.sequence else m.case
    if replayed != m.case:  # what fails again in a fresh process
        lines.append(st.text(f"fails again in one fresh process as: {replayed.short()}"))
    parts = ["\n".join(st.item(line) for line in lines),
             f"```json\n{m.case.to_json()}\n```" if st.md else m.case.to_json()]
    if m.metrics:
        parts.append(table(metrics_rows(m.metrics, m.case.dtype), METRIC_HEADERS, style))
    parts += reproducer_lines(f, style)
    return "\n\n".join(parts) if st.md else "\n".join(parts)


def reproducer_lines(f: Failure, style: str) -> list:
    """The reproducer of a failure seen to fail when replayed alone (confirm.py), a line that is a command
    and nothing else, and where the case can be drawn, a line of its own saying how; otherwise what the
    replay found, and no line that would pass."""
    st = Style(style)
    if f.reproduced and f.earlier_calls:
        return [f"reproduce (after {f.earlier_calls} earlier call(s) in one process): {st.code(f.reproducer)}"]
    if f.reproduced:
        drawn = not plot_refusal(f.minimal.case) and f.minimal.metrics
        return [f"reproduce: {st.code(f.reproducer)}"] + (
            [f"to see where its error sits, add {st.code('--plot err.svg')} (or err.png) to that command"]
            if drawn else [])
    return [_unreproduced(f, st)]


def _unreproduced(f: Failure, st: Style) -> str:
    if f.replayed == REPLAY_PASSED:
        return "no reproducer (not reproduced alone): " + st.text(f.replay_reason)
    why = f.replay_reason or "not replayed before it was written (a run file before schema 6)"
    return f"reproduce ({st.text(why)}; unconfirmed): {st.code(f.reproducer)}"


def shards_line(environments: list) -> str:
    """A merged run: how many shards, and what differed between their environments."""
    keys = [k for k in ("torch", "triton", "driver", "gpus") if len({str(e.get(k)) for e in environments}) > 1]
    if not keys:
        return f"merged from {len(environments)} shards, all in the same environment"
    differing = "; ".join(f"{e['shard']}: " + ", ".join(f"{k} {e.get(k)}" for k in keys) for e in environments)
    return f"merged from {len(environments)} shards; their environments differ: {differing}"


def verdict_lines(run: Run, style: str) -> list:
    """What a reviewer reads first: PASS or FAIL in one line (and what was not checked, where most of the
    cases drawn were skipped), and for a failure the worst one's minimal case in words and its reproducer."""
    lines = _verdict(run, style)
    return [lines[0] + Style(style).text(_skipped_most(run)), *lines[1:]]


def _skipped_most(run: Run) -> str:
    """Where more than half the cases drawn were skipped: how many, so a pass is not read as a pass of all."""
    drawn = sum(k["summary"]["cases"] for k in run.kernels)
    skipped = sum(k["summary"]["skipped"] for k in run.kernels)
    if run.ran == 0 or 2 * skipped <= drawn:
        return ""
    return f"; {skipped} of the {drawn} cases drawn were skipped (see Skipped cases for why)"


def _verdict(run: Run, style: str) -> list:
    st = Style(style)
    kernels = st.text(", ".join(k["summary"]["kernel"] for k in run.kernels))
    interrupted = " (interrupted)" if run.settings.get("interrupted") else ""
    failures = run.failures()
    if not failures and not run.failed:
        if run.ran == 0:
            return [f"{st.bold('NOTHING RAN')}: every case of {kernels} was skipped{interrupted}"]
        if run.errors:  # cases nobody judged: a pass would claim them
            return [f"{st.bold('INCOMPLETE')}: faverify's own code raised on {run.errors} of {run.ran} cases of "
                    f"{kernels} (a bug in faverify), which were not judged; the other {run.ran - run.errors} "
                    f"passed{interrupted}"]
        if interrupted:  # a part of the run passed: nothing was proven of the whole
            return [f"{st.bold('INTERRUPTED')}: {run.ran} cases of {kernels} ran before the stop, all within "
                    "tolerance of the FP64 reference; the run did not finish"]
        return [f"{st.bold('PASS')}: {run.ran} cases of {kernels} within tolerance of the FP64 reference"]
    if not failures:
        return [f"{st.bold('FAIL')}: {kernels}{interrupted}; no failure was recorded with its case"]
    worst, signature, usage = worst_failure(run, failures)
    distinct = f"{len(failures)} distinct failure" + ("s" if len(failures) > 1 else "")
    named = st.text(", ".join(f.signature for f in failures[:4]) + (", ..." if len(failures) > 4 else ""))
    what = worst.signature if signature == worst.signature else f"{worst.signature} with {signature}"
    size = f", up to {usage:.3g} times the allowed error" if math.isfinite(usage) else ""
    return [f"{st.bold('FAIL')}: {distinct} ({named}){interrupted}; the worst, "
            + st.text(f"{worst.kernel} {what}{size}; minimal case {worst.minimal.case.short()}"),
            *reproducer_lines(worst, style)]


def worst_failure(run: Run, failures: list) -> tuple:
    """(the failure, the signature of its group, its largest error over allowed) whose group, the failure's
    signature and its companions, holds the largest error over allowed of the run's failing cases. NaN, Inf
    and a signature that is no tensor's error (a crash, a broken contract) count as infinite; among equals
    the first failure stands."""
    usage: dict = {}  # (kernel, tensor) -> the largest err/allowed of the failing cases (the stats' rows)
    for k in run.kernels:
        for row in k["stats"]:
            if row.get("outcome") == "failing":
                key, found = (row["kernel"], row["tensor"]), num(row.get("usage_max"))  # NaN: none judged
                usage[key] = max(usage.get(key, 0.0), found if found == found else 0.0)

    def size(kernel: str, signature: str) -> float:
        tensor, _, kind = signature.partition(":")
        if kind in ("nan", "inf") or (kernel, tensor) not in usage:
            return math.inf
        return usage[(kernel, tensor)]
    ranked = [(size(f.kernel, s), -i, f, s) for i, f in enumerate(failures) for s in (f.signature, *f.companions)]
    top = max(ranked, key=lambda r: r[:2])
    return top[2], top[3], top[0]


def render(run: Run, style: str = "table") -> str:
    st = Style(style)
    out = [("  \n" if st.md else "\n").join(verdict_lines(run, style)), st.heading("faverify " + run.command, 1)]
    out.append("\n".join(st.item(st.text(line)) for line in header_lines(run.environment)))
    out.append(st.item(st.text("settings: " + ", ".join(f"{k}={v}" for k, v in run.settings.items()))))
    out.append(st.item(st.text(f"tolerance: {run.tolerance.get('rule', '')}")))
    if run.settings.get("shard_environments"):
        out.append(st.item(st.text(shards_line(run.settings["shard_environments"]))))
    out += summary_blocks(run, st)
    out.extend(statistics_blocks(run, style))
    out.append(st.item("floor share: the part of the allowed error that the floor gave (the rest is factor x the "
                       "baseline's error); near 1, the verdict rests on the floor alone"))
    out.append(st.item(st.text(RATIO_NOTE)))
    out += tail_blocks(run, st)
    return "\n\n".join(out) + "\n"


def summary_blocks(run: Run, st: Style) -> list:
    """The summary table, then a line per count kept beside it."""
    rows = []
    for k in run.kernels:
        s = k["summary"]
        verdict = "FAIL" if s["failed"] else ("nothing ran" if s["cases"] == s["skipped"] else "pass")
        rows.append([s["kernel"], str(s["cases"]), str(s["passed"]), str(s["failed"]), str(s["crashed"]),
                     str(s["timed_out"]), str(s["skipped"]), fmt(s["seconds"], ".1f"),
                     fmt(s["cases_per_second"], ".1f"), verdict])
    out = [st.heading("Summary"), table(rows, ["kernel", "cases", "passed", "failed", "crashed", "timed out", "skipped",
                                               "seconds", "cases/s", "verdict"], st.name)]
    out += [st.item(st.text(f"{label}: {text}")) for label, text in summary_lines(run) if text]
    return out


def _per_kernel(run: Run, line) -> str:
    """'kernel: text; kernel: text' over the kernels for which line(summary) gives text."""
    return "; ".join(f"{k['summary']['kernel']}: {text}" for k in run.kernels if (text := line(k["summary"])))


def _counted(rows: dict) -> str:
    return ", ".join(f"{r} {v['cases']}" + (f" ({v['failed']} failed)" if v["failed"] else "")
                     for r, v in sorted(rows.items()))


def summary_lines(run: Run) -> list:
    """(label, text) of each count a summary keeps: empty text where the run has none."""
    own = _per_kernel(run, lambda s: f"{s['errors']} cases, the first: {s['error_reasons'][0].splitlines()[0]}"
                      if s.get("errors") and s.get("error_reasons") else "")
    return [
        ("faverify's own errors (a bug in faverify, not counted against the kernel; the run exits 2)", own),
        ("call sequences (--sequence: each case the last call of one, every call judged)",
         _per_kernel(run, lambda s: f"{s['cases']} sequences, {s['calls']} calls"
                     if s.get("calls", s["cases"]) != s["cases"] else "")),
        ("compiles (a subject that compiles per configuration; their time is the compile phase)",
         _per_kernel(run, lambda s: f"{s['compiles']} for {len(s['configurations'])} configurations"
                     + (f", cases drawn from {s['shapes']} shapes (--shapes)" if s.get("shapes") else "")
                     if s.get("configurations") else "")),
        ("cases per device", _per_kernel(run, lambda s: ", ".join(f"{d} {n}" for d, n in
                                                                   sorted(s.get("per_device", {}).items())))),
        ("relations checked bit for bit (run/relations.py; a promised one broken fails)", _per_kernel(run, _relations)),
        ("cases per code path (what the subject launched)",
         _per_kernel(run, lambda s: ", ".join(f"{p} {n}" for p, n in s.get("paths", {}).items()))),
        ("passed on less than asked", "; ".join(f"{k['summary']['kernel']}: {n} cases, {reason}" for k in run.kernels
                                                for reason, n in k["summary"].get("partial_reasons", {}).items())),
        ("conventions judged by", _per_kernel(run, lambda s: s.get("conventions", ""))),
        ("cases per feature (a case may use several)",
         _per_kernel(run, lambda s: ", ".join(f"{f} {n}" for f, n in s.get("features", {}).items())
                     if set(s.get("features", {})) - {"dense"} else "")),
        ("cases run per regime", _per_kernel(run, lambda s: _counted(s.get("regimes", {})))),
        ("cases run per layout", _per_kernel(run, lambda s: _counted(s.get("layouts", {})))),
        ("cases run per mask, bias and score_mod", _per_kernel(run, lambda s: _counted(s.get("masks", {})))),
        (f"edges drawn fewer than {EDGE_FLOOR} times (edges.py; the counts are in the run file)",
         _per_kernel(run, lambda s: ", ".join(f"{e} {n}" for e, n in s.get("edges", {}).items() if n < EDGE_FLOOR)
                     or (f"none of {len(s['edges'])}" if s.get("edges") else ""))),
        ("warm-up (compiling each variant once, included in seconds)", _per_kernel(run, _warmup)),
        ("run again alone after the others, skipped for memory while other workers held the device (their second "
         "verdict counts)", _per_kernel(run,
                                        lambda s: f"{s['memory_retried']} cases" if s.get("memory_retried") else "")),
        ("replayed first from the example store (--db; not among the cases or the statistics)",
         _per_kernel(run, lambda s: f"{s['replayed']['cases']} cases, {s['replayed']['failed']} failed"
                     if s.get("replayed", {}).get("cases") else "")),
        ("ms per case by phase", "; ".join(f"{k['summary']['kernel']}: " + ", ".join(
            f"{p} {v:.2f}" for p, v in k["summary"].get("ms_per_case", {}).items()) for k in run.kernels)),
    ]


def tail_blocks(run: Run, st: Style) -> list:
    """By feature, the gradient checks, the skips and the failures."""
    out = []
    rows = [[k["summary"]["kernel"], f, str(v["cases"]), str(v["failed"]), fmt(v["usage_max"], ".2f")]
            for k in run.kernels for f, v in k["summary"].get("by_feature", {}).items()]
    if any(r[1] != "dense" for r in rows):
        out.append(st.heading("By variant feature (a case counts under each feature it uses)"))
        out.append(table(rows, ["kernel", "feature", "cases run", "failed", "err/allowed max"], st.name))
    out.extend(fp8_blocks(run, st))
    out.append(st.heading("Gradient checks (finite differences of the subject's own forward)"))
    rows = [[r["kernel"], r["dtype"], str(r["checks"]), str(r["failed"]), fmt(r["rel_err_p50"]),
             fmt(r["rel_err_max"]), fmt(r["usage_max"], ".2f") if "usage_max" in r else "-"]
            for k in run.kernels for r in k["gradcheck"]]
    out.append(table(rows, ["kernel", "dtype", "checks", "failed", "rel err p50", "rel err max", "err/allowed max"],
                     st.name))
    skipped = [[k["summary"]["kernel"], str(n), reason] for k in run.kernels
               for reason, n in k["summary"]["skip_reasons"].items()]
    if skipped:
        out.append(st.heading("Skipped cases"))
        out.append(table(skipped[:40], ["kernel", "cases", "reason"], st.name))
    failures = run.failures()
    out.append(st.heading(f"Failures ({len(failures)})"))
    out.extend(failure_block(f, st.name) for f in failures) if failures else out.append("none")
    return out


def fp8_blocks(run: Run, st: Style) -> list:
    """The FP8 cases run, a row per kernel, format and descale granularity, a column per regime: "cases" or
    "cases (failed)"."""
    cells: dict = {}
    for k in run.kernels:
        for key, v in k["summary"].get("fp8", {}).items():
            fmt_, per, regime = key.split(" ")
            row = cells.setdefault((k["summary"]["kernel"], fmt_, per), {})
            row[regime] = f"{v['cases']}" + (f" ({v['failed']} failed)" if v["failed"] else "")
    if not cells:
        return []
    regimes = [r for r in REGIMES_ALL if any(r in row for row in cells.values())]
    rows = [[*key, *(row.get(r, "-") for r in regimes)] for key, row in sorted(cells.items())]
    return [st.heading("FP8 cases run by format, descale granularity and regime"),
            table(rows, ["kernel", "format", "descales per", *regimes], st.name)]


STAT_HEADERS = ["kernel", "dtype", "tensor", "cases", "failed", "waived", "max err", "mean err", "max rel",
                "max abs ref",
                "max ulp", "nan", "inf", "ratio p50", "ratio p99", "ratio max", "err/allowed p50", "err/allowed max",
                "floor share p50"]
_OUTCOMES = (("passing", "the passing cases"), ("failing", "the failing cases"), (None, "every case"))


def _stat_row(r: dict, style: str) -> list:
    row = [r["kernel"], r["dtype"], r["tensor"], str(r["cases"]), str(r["failed"]), str(r["waived"]), fmt(r["max_abs"]),
           fmt(r["mean_abs"]), fmt(r["max_rel"]), fmt(r.get("ref_max")), fmt(r["max_ulp"], ".3g"), str(r["nan"]),
           str(r["inf"]), ratio(r["ratio_p50"]), ratio(r["ratio_p99"]), ratio(r["ratio_max"]),
           fmt(r.get("usage_p50"), ".2f"), fmt(r.get("usage_max"), ".2f"), fmt(r.get("floor_share_p50"), ".2f")]
    if style == "table":
        row.append(margin_bar(r.get("usage_max")))
    return row


def margin_bar(usage, width: int = 10) -> str:
    """err/allowed as a bar of `width` cells, the limit at the end; past it, the bar ends in !."""
    u = num(usage)
    if u != u:
        return ""
    cells = min(width, max(0, round(u * width)))
    return "#" * cells + "." * (width - cells) + ("!" if u > 1 else "|")


def statistics_blocks(run: Run, style: str) -> list:
    """The error statistics of the passing cases and of the failing ones, apart (a file before schema 3
    has one table of every case), and in Markdown a chart of the passing cases' err/allowed."""
    st = Style(style)
    out = []
    for outcome, title in _OUTCOMES:
        rows = [r for k in run.kernels for r in k["stats"] if r.get("outcome") == outcome]
        if not rows:
            continue
        out.append(st.heading(f"Error statistics of {title} (against FP64; waived cases counted apart)"))
        headers = STAT_HEADERS + (["err/allowed max, limit |"] if style == "table" else [])
        out.append(table([_stat_row(r, style) for r in rows], headers, style))
        if st.md and outcome != "failing":
            chart = margin_chart(rows)
            if chart:
                out.append(chart)
    return out


def _relations(summary: dict) -> str:
    """Each promised relation: of the cases it applies to, how many held bit for bit."""
    return ", ".join(f"{name} ({'promised' if r.get('promised', True) else 'measured'}) {r['equal']} of "
                     f"{r['checked']} equal"
                     + (f" (largest relative difference {r['max_diff']:.3g})" if r["equal"] < r["checked"] else "")
                     for name, r in summary.get("relations", {}).items())


def _warmup(summary: dict) -> str:
    """The warm-up's cases and seconds, and the Triton builds compiled ahead of them (warmup.py), if any."""
    warm = summary.get("warmup", {})
    if not warm.get("cases"):
        return ""
    text = f"{warm['cases']} cases in {warm['seconds']:.1f} s"
    b = warm.get("builds")
    if b:
        text += (f"; {b['builds']} Triton builds for {b['target']}: {b['compiled']} compiled, {b['cached']} found in "
                 f"the cache, {b['failed']} failed, by {b['jobs']} processes in {b['seconds']:.1f} s")
        text += f" ({b['error']})" if b.get("error") else ""
    return text
