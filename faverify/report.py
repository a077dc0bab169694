"""Render a run as terminal tables or GitHub-flavored Markdown (pipe tables, numbers right-aligned)."""
from __future__ import annotations

import math

from tabulate import tabulate

from faverify.collector import REPLAY_PASSED, Failure
from faverify.env import header_lines
from faverify.results import Run, num

TABLE_FORMAT = {"table": "simple", "md": "pipe"}  # pipe: alignment colons GitHub renders


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


def _numeric(cell: str) -> bool:
    if cell in ("-", "inf", "-inf", ""):
        return True
    try:
        float(cell)
        return True
    except ValueError:
        return False


def table(rows: list, headers: list, style: str) -> str:
    """Cells arrive formatted; columns whose cells are all numbers are right-aligned."""
    if not rows:
        return "(none)"
    align = ["right" if all(_numeric(str(r[i])) for r in rows) else "left" for i in range(len(headers))]
    return tabulate(rows, headers=headers, tablefmt=TABLE_FORMAT[style], colalign=align, disable_numparse=True)


def _heading(text: str, style: str, level: int = 2) -> str:
    return f"{'#' * level} {text}" if style == "md" else f"== {text} =="


def _below_one_rounding(m: dict, dtype: str | None) -> bool:
    """The baseline was more exact than one rounding of the tensor's terms: the ratio is against that."""
    from faverify.dtypes import UNIT_ROUNDOFF
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
    m = f.minimal
    lines = [f"{f.kernel}: {f.signature} ({f.occurrences} case(s); shrunk in {f.shrink_steps} steps)"
             + (f"; {f.note}" if f.note else ""),
             f"minimal case: {m.case.short()}",
             f"reason: {m.reason}"]
    block = "\n".join(("- " + line) if style == "md" else line for line in lines)
    parts = [block]
    if style == "md":
        parts.append(f"```json\n{m.case.to_json()}\n```")
    else:
        parts.append(m.case.to_json())
    if m.metrics:
        parts.append(table(metrics_rows(m.metrics, m.case.dtype), METRIC_HEADERS, style))
    parts.append(reproducer_line(f, style))
    return "\n\n".join(parts) if style == "md" else "\n".join(parts)


def reproducer_line(f: Failure, style: str) -> str:
    """The reproducer of a failure seen to fail when replayed alone (confirm.py); otherwise what the replay
    found, and no line that would pass."""
    code = f"`{f.reproducer}`" if style == "md" else f.reproducer
    if f.reproduced:
        return f"reproduce: {code}"
    if f.replayed == REPLAY_PASSED:
        return f"no reproducer (not reproduced alone): {f.replay_reason}"
    why = f.replay_reason or "not replayed before it was written (a run file before schema 6)"
    return f"reproduce ({why}; unconfirmed): {code}"


def shards_line(environments: list) -> str:
    """A merged run: how many shards, and what differed between their environments."""
    keys = [k for k in ("torch", "triton", "driver", "gpus") if len({str(e.get(k)) for e in environments}) > 1]
    if not keys:
        return f"merged from {len(environments)} shards, all in the same environment"
    differing = "; ".join(f"{e['shard']}: " + ", ".join(f"{k} {e.get(k)}" for k in keys) for e in environments)
    return f"merged from {len(environments)} shards; their environments differ: {differing}"


def verdict_lines(run: Run, style: str) -> list:
    """What a reviewer reads first: PASS or FAIL in one line, and for a failure the first one's minimal
    case in words and its reproducer."""
    kernels = ", ".join(k["summary"]["kernel"] for k in run.kernels)
    interrupted = " (interrupted)" if run.settings.get("interrupted") else ""
    failures = run.failures()
    bold = (lambda t: f"**{t}**") if style == "md" else (lambda t: t)
    if not failures and not run.failed:
        if run.ran == 0:
            return [f"{bold('NOTHING RAN')}: every case of {kernels} was skipped{interrupted}"]
        if interrupted:  # a part of the run passed: nothing was proven of the whole
            return [f"{bold('INTERRUPTED')}: {run.ran} cases of {kernels} ran before the stop, all within "
                    "tolerance of the FP64 reference; the run did not finish"]
        return [f"{bold('PASS')}: {run.ran} cases of {kernels} within tolerance of the FP64 reference"]
    if not failures:
        return [f"{bold('FAIL')}: {kernels}{interrupted}; no failure was recorded with its case"]
    first = failures[0]
    distinct = f"{len(failures)} distinct failure" + ("s" if len(failures) > 1 else "")
    return [f"{bold('FAIL')}: {distinct} ({', '.join(f.signature for f in failures[:4])}"
            f"{', ...' if len(failures) > 4 else ''}){interrupted}; the first, {first.kernel} {first.signature}, "
            f"on {first.minimal.case.short()}",
            reproducer_line(first, style)]


def render(run: Run, style: str = "table") -> str:
    out = ["\n".join(verdict_lines(run, style)) if style == "table" else "  \n".join(verdict_lines(run, style)),
           _heading("faverify " + run.command, style, 1)]
    env = header_lines(run.environment)
    out.append("\n".join(("- " + line) if style == "md" else line for line in env))
    settings = ", ".join(f"{k}={v}" for k, v in run.settings.items())
    out.append(("- " if style == "md" else "") + f"settings: {settings}")
    out.append(("- " if style == "md" else "") + f"tolerance: {run.tolerance.get('rule', '')}")
    if run.settings.get("shard_environments"):
        out.append(("- " if style == "md" else "") + shards_line(run.settings["shard_environments"]))

    out.append(_heading("Summary", style))
    rows = []
    for k in run.kernels:
        s = k["summary"]
        verdict = "FAIL" if s["failed"] else ("nothing ran" if s["cases"] == s["skipped"] else "pass")
        rows.append([s["kernel"], str(s["cases"]), str(s["passed"]), str(s["failed"]), str(s["crashed"]),
                     str(s["timed_out"]), str(s["skipped"]), fmt(s["seconds"], ".1f"),
                     fmt(s["cases_per_second"], ".1f"), verdict])
    out.append(table(rows, ["kernel", "cases", "passed", "failed", "crashed", "timed out", "skipped", "seconds",
                            "cases/s", "verdict"], style))
    own = "; ".join(f"{k['summary']['kernel']}: {k['summary']['errors']} cases, the first: "
                    + k["summary"]["error_reasons"][0].splitlines()[0] for k in run.kernels
                    if k["summary"].get("errors") and k["summary"].get("error_reasons"))
    if own:
        out.append(("- " if style == "md" else "") + "faverify's own errors (a bug in faverify, not counted against "
                   f"the kernel; the run exits 2): {own}")
    devices = "; ".join(f"{k['summary']['kernel']}: " + ", ".join(f"{d} {n}" for d, n in
                                                                  sorted(k["summary"].get("per_device", {}).items()))
                        for k in run.kernels if k["summary"].get("per_device"))
    if devices:
        out.append(("- " if style == "md" else "") + f"cases per device: {devices}")
    paths = "; ".join(f"{k['summary']['kernel']}: " + ", ".join(f"{p} {n}" for p, n in k["summary"]["paths"].items())
                      for k in run.kernels if k["summary"].get("paths"))
    if paths:
        out.append(("- " if style == "md" else "") + f"cases per code path (what the subject launched): {paths}")
    partial = "; ".join(f"{k['summary']['kernel']}: {n} cases, {reason}" for k in run.kernels
                        for reason, n in k["summary"].get("partial_reasons", {}).items())
    if partial:
        out.append(("- " if style == "md" else "") + f"passed on less than asked: {partial}")
    judged_by = "; ".join(f"{k['summary']['kernel']}: {k['summary']['conventions']}" for k in run.kernels
                          if k["summary"].get("conventions"))
    if judged_by:
        out.append(("- " if style == "md" else "") + f"conventions judged by: {judged_by}")
    features = "; ".join(f"{k['summary']['kernel']}: " + ", ".join(f"{f} {n}" for f, n in k["summary"]["features"].items())
                         for k in run.kernels if set(k["summary"].get("features", {})) - {"dense"})
    if features:
        out.append(("- " if style == "md" else "") + f"cases per feature (a case may use several): {features}")
    for name, label in (("regimes", "regime"), ("layouts", "layout"), ("masks", "mask, bias and score_mod")):
        met = "; ".join(f"{k['summary']['kernel']}: " + ", ".join(
            f"{r} {v['cases']}" + (f" ({v['failed']} failed)" if v["failed"] else "")
            for r, v in sorted(k["summary"][name].items())) for k in run.kernels if k["summary"].get(name))
        if met:
            out.append(("- " if style == "md" else "") + f"cases run per {label}: {met}")
    warmed = "; ".join(f"{k['summary']['kernel']}: {w['cases']} cases in {w['seconds']:.1f} s"
                       for k in run.kernels if (w := k["summary"].get("warmup", {})).get("cases"))
    if warmed:
        out.append(("- " if style == "md" else "") + f"warm-up (compiling each variant once, included in "
                   f"seconds): {warmed}")
    retried = "; ".join(f"{k['summary']['kernel']}: {n} cases" for k in run.kernels
                        if (n := k["summary"].get("memory_retried", 0)))
    if retried:
        out.append(("- " if style == "md" else "") + "run again alone after the others, skipped for memory while "
                   f"other workers held the device (their second verdict counts): {retried}")
    replayed = "; ".join(f"{k['summary']['kernel']}: {r['cases']} cases, {r['failed']} failed"
                         for k in run.kernels if (r := k["summary"].get("replayed", {})).get("cases"))
    if replayed:
        out.append(("- " if style == "md" else "") + "replayed first from the example store (--db; not among the "
                   f"cases or the statistics): {replayed}")
    timing = "; ".join(f"{k['summary']['kernel']}: " + ", ".join(f"{p} {v:.2f}" for p, v in
                                                                 k["summary"].get("ms_per_case", {}).items())
                       for k in run.kernels)
    out.append(("- " if style == "md" else "") + f"ms per case by phase: {timing}")

    out.extend(statistics_blocks(run, style))
    out.append(("- " if style == "md" else "") + "floor share: the part of the allowed error that the floor gave "
               "(the rest is factor x the baseline's error); near 1, the verdict rests on the floor alone")
    out.append(("- " if style == "md" else "") + RATIO_NOTE)

    rows = [[k["summary"]["kernel"], f, str(v["cases"]), str(v["failed"]), fmt(v["usage_max"], ".2f")]
            for k in run.kernels for f, v in k["summary"].get("by_feature", {}).items()]
    if any(r[1] != "dense" for r in rows):
        out.append(_heading("By variant feature (a case counts under each feature it uses)", style))
        out.append(table(rows, ["kernel", "feature", "cases run", "failed", "err/allowed max"], style))

    out.append(_heading("Gradient checks (finite differences of the subject's own forward)", style))
    rows = [[r["kernel"], r["dtype"], str(r["checks"]), str(r["failed"]), fmt(r["rel_err_p50"]),
             fmt(r["rel_err_max"]), fmt(r["allowed"])] for k in run.kernels for r in k["gradcheck"]]
    out.append(table(rows, ["kernel", "dtype", "checks", "failed", "rel err p50", "rel err max", "allowed"], style))

    skipped = [[k["summary"]["kernel"], str(n), reason] for k in run.kernels
               for reason, n in k["summary"]["skip_reasons"].items()]
    if skipped:
        out.append(_heading("Skipped cases", style))
        out.append(table(skipped[:40], ["kernel", "cases", "reason"], style))

    failures = run.failures()
    out.append(_heading(f"Failures ({len(failures)})", style))
    out.extend(failure_block(f, style) for f in failures) if failures else out.append("none")
    return "\n\n".join(out) + "\n"


STAT_HEADERS = ["kernel", "dtype", "tensor", "cases", "failed", "waived", "max err", "mean err", "max rel", "max abs ref",
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
    out = []
    for outcome, title in _OUTCOMES:
        rows = [r for k in run.kernels for r in k["stats"] if r.get("outcome") == outcome]
        if not rows:
            continue
        out.append(_heading(f"Error statistics of {title} (against FP64; waived cases counted apart)", style))
        headers = STAT_HEADERS + (["err/allowed max, limit |"] if style == "table" else [])
        out.append(table([_stat_row(r, style) for r in rows], headers, style))
        if style == "md" and outcome != "failing":
            from faverify.charts import margin_chart
            chart = margin_chart(rows)
            if chart:
                out.append(chart)
    return out
