"""Compare two runs: what newly fails, whose margin shrank, what got worse or better, what cannot be
compared; the verdict in one line first.

One row per kernel/dtype/tensor/statistic present in either run, the statistics of the passing cases
(the failing ones are counted in `failed`, `nan` and `inf`). Marks:
  !  newly failing (no failure before, some now)
  +  worse by more than the factor F (for usage_max, the error over the allowed: the margin shrank)
  -  better by more than F
  x  not comparable: the row is in one run only, the runs used different GPU models, the statistic
     was defined anew between the runs' schema versions, or the base gives it and the head does not
Rows come in that order: newly failing, then worse with the margins first, then better. A base statistic
that cannot be compared (x, but for a statistic defined anew) leaves the head not shown to be no worse:
unless the head regressed, the verdict says so and compare exits 2.
Environments may differ (torch, driver, ...): the runs are compared anyway and the differences listed.
"""
from __future__ import annotations

import math

from faverify.reports.results import Run, num

STATISTICS = ("failed", "usage_max", "max_abs", "mean_abs", "max_ulp", "ratio_p99", "nan", "inf")
_COUNTS = ("failed", "nan", "inf")  # summed over the passing and the failing cases' rows
# statistics a schema version defined anew: not compared with a run file of an older version
REDEFINED = {3: ("max_ulp", "ratio_p99", "max_rel")}
_ENV_KEYS = ("torch", "torch_cuda", "triton", "driver", "nvcc", "python")


def _rows(run: Run, label: str | None = None) -> dict:
    """(kernel, dtype, tensor) -> statistics: those of the passing cases (a file before version 3 has one
    row of every case), the counts of all."""
    rows: dict = {}
    for k in run.kernels:
        for r in k["stats"]:
            key = (label or r["kernel"], r["dtype"], r["tensor"])
            merged = rows.setdefault(key, {**{stat: math.nan for stat in STATISTICS}, **{c: 0.0 for c in _COUNTS}})
            if r.get("outcome", "passing") == "passing":
                merged.update({stat: num(r.get(stat)) for stat in STATISTICS if stat not in _COUNTS})
            for c in _COUNTS:
                n = num(r.get(c))
                merged[c] += n if n == n else 0.0
    return rows


def _redefined(base: Run, head: Run) -> set:
    low, high = sorted((base.version, head.version))
    return {stat for version, stats in REDEFINED.items() if low < version <= high for stat in stats}


def _kernel_label(base: Run, head: Run) -> str | None:
    """Two runs of one kernel each are compared kernel to kernel, whatever their names (a candidate against
    the kernel it replaces, a mutant against the original): rows are matched by dtype and tensor."""
    if len(base.kernels) == 1 and len(head.kernels) == 1:
        a, b = base.kernels[0]["summary"]["kernel"], head.kernels[0]["summary"]["kernel"]
        return a if a == b else f"{a} -> {b}"
    return None


def _gpus(run: Run) -> tuple:
    return tuple(sorted({g["name"] for g in run.environment.get("gpus", [])}))


def environment_differences(base: Run, head: Run) -> list:
    out = []
    for key in _ENV_KEYS:
        a, b = base.environment.get(key), head.environment.get(key)
        if a != b:
            out.append(f"{key}: {a} -> {b}")
    if _gpus(base) != _gpus(head):
        out.append(f"GPUs: {', '.join(_gpus(base)) or 'none'} -> {', '.join(_gpus(head)) or 'none'}")
    for key in ("iters", "seed", "dtypes", "mode", "max_seqlen"):
        a, b = base.settings.get(key), head.settings.get(key)
        if a != b:
            out.append(f"setting {key}: {a} -> {b}")
    if base.tolerance.get("rule") != head.tolerance.get("rule"):
        out.append("tolerance rules differ")
    if base.version != head.version:
        redefined = ", ".join(sorted(_redefined(base, head)))
        out.append(f"run schema version {base.version} -> {head.version}"
                   + (f": {redefined} defined anew, not compared" if redefined else ""))
    return out


def _mark(stat: str, before: float, after: float, factor: float) -> str:
    if stat in ("failed", "nan", "inf"):
        if before == 0 and after > 0:
            return "!"
        return "+" if after > before * factor else ("-" if before > after * factor else "")
    if math.isnan(before) or math.isnan(after):
        return ""
    tiny = 1e-30  # an error of exactly 0 before: any error now is worse without bound
    if after > max(before, tiny) * factor:
        return "+"
    if before > max(after, tiny) * factor:
        return "-"
    return ""


def compare_runs(base: Run, head: Run, factor: float) -> dict:
    label = _kernel_label(base, head)
    a, b = _rows(base, label), _rows(head, label)
    gpu_changed = _gpus(base) != _gpus(head)
    redefined = _redefined(base, head)
    rows, uncompared = [], 0  # the base's statistics the head cannot be compared on (the schema's aside)
    for key in sorted(set(a) | set(b)):
        ra, rb = a.get(key), b.get(key)
        for stat in STATISTICS:
            before = num(ra.get(stat)) if ra else math.nan
            after = num(rb.get(stat)) if rb else math.nan
            if ra is None or rb is None or gpu_changed or stat in redefined or (before == before and after != after):
                mark = "x"  # the last: a statistic the base gives and the head cannot (no passing case, a bad value)
            else:
                mark = _mark(stat, before, after, factor)
            if mark == "x" and ra is not None and stat not in redefined:
                uncompared += 1
            if ra and rb and before == 0 and after == 0:
                ratio = 1.0
            elif before == 0:
                ratio = math.inf if after > 0 else math.nan
            else:
                ratio = after / before
            rows.append({"kernel": key[0], "dtype": key[1], "tensor": key[2], "statistic": stat,
                         "before": before, "after": after, "ratio": ratio, "mark": mark})
    base_failed = {label or k["summary"]["kernel"]: k["summary"]["failed"] for k in base.kernels}
    for k in head.kernels:  # a kernel that failed only now (a crash, a timeout) shows even without stats
        name = label or k["summary"]["kernel"]
        if k["summary"]["failed"] and not base_failed.get(name):
            rows.append({"kernel": name, "dtype": "-", "tensor": "-", "statistic": "failed cases",
                         "before": float(base_failed.get(name, 0)), "after": float(k["summary"]["failed"]),
                         "ratio": math.inf, "mark": "!"})
    rows.sort(key=_importance)
    counts = {m: sum(r["mark"] == m for r in rows) for m in ("+", "-", "!", "x")}
    shrank = sorted({(r["kernel"], r["dtype"], r["tensor"]) for r in rows
                     if r["statistic"] == "usage_max" and r["mark"] == "+"})
    return {"factor": factor, "rows": rows, "counts": counts, "margin_shrank": [" ".join(k) for k in shrank],
            "environment_differences": environment_differences(base, head),
            "regressed": counts["+"] > 0 or counts["!"] > 0,
            "comparable": sum(r["mark"] != "x" for r in rows), "uncompared": uncompared,
            "interrupted": [side for side, run in (("base", base), ("head", head))
                            if run.settings.get("interrupted")]}


_ORDER = {"!": 0, "+": 1, "-": 2, "x": 3, "": 4}


def _importance(row: dict) -> tuple:
    """Newly failing first, then worse with the margins (usage_max) first and the largest change first."""
    change = row["ratio"] if row["ratio"] == row["ratio"] else 0.0
    return _ORDER[row["mark"]], row["statistic"] != "usage_max", -change if row["mark"] == "+" else 0.0


def summary_line(result: dict) -> str:
    """Whether the head is worse, in one line."""
    c = result["counts"]
    shrank = result.get("margin_shrank", [])
    margins = f", the margin shrank on {', '.join(shrank[:3])}{', ...' if len(shrank) > 3 else ''}" if shrank else ""
    missing = result.get("uncompared", 0)
    verdict = ("REGRESSION: the head is worse" if result["regressed"] else
               f"NOT COMPARED: no regression among the rows compared, but {missing} of the base's statistics could "
               "not be compared with the head" if missing else "no regression: the head is not worse")
    stopped = result.get("interrupted", [])
    cut = (f"; the {' and the '.join(stopped)} run{'s were' if len(stopped) > 1 else ' was'} interrupted, "
           "its statistics cover the cases it ran" if stopped else "")
    return (f"{verdict} ({c['!']} newly failing (!), {c['+']} worse (+){margins}; {c['-']} better (-), "
            f"{c['x']} not comparable (x); factor {result['factor']:g}){cut}")
