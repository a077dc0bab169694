"""Compare two runs: what got worse, what got better, what newly fails, what cannot be compared.

One row per kernel/dtype/tensor/statistic present in either run. Marks:
  +  worse by more than the factor F      -  better by more than F
  !  newly failing (no failure before, some now)
  x  not comparable: the row is in one run only, or the runs used different GPU models
Environments may differ (torch, driver, ...): the runs are compared anyway and the differences listed.
"""
from __future__ import annotations

import math

from faverify.report import num
from faverify.results import Run

STATISTICS = ("max_abs", "mean_abs", "max_ulp", "ratio_p99", "nan", "inf", "failed")
_ENV_KEYS = ("torch", "torch_cuda", "triton", "driver", "nvcc", "python")


def _rows(run: Run, label: str | None = None) -> dict:
    return {(label or r["kernel"], r["dtype"], r["tensor"]): r for k in run.kernels for r in k["stats"]}


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
    rows = []
    for key in sorted(set(a) | set(b)):
        ra, rb = a.get(key), b.get(key)
        for stat in STATISTICS:
            before = num(ra.get(stat)) if ra else math.nan
            after = num(rb.get(stat)) if rb else math.nan
            if ra is None or rb is None or gpu_changed:
                mark = "x"
            else:
                mark = _mark(stat, before, after, factor)
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
    counts = {m: sum(r["mark"] == m for r in rows) for m in ("+", "-", "!", "x")}
    return {"factor": factor, "rows": rows, "counts": counts,
            "environment_differences": environment_differences(base, head),
            "regressed": counts["+"] > 0 or counts["!"] > 0}


def summary_line(result: dict) -> str:
    c = result["counts"]
    verdict = "REGRESSION" if result["regressed"] else "no regression"
    return (f"{verdict}: {c['+']} worse (+), {c['!']} newly failing (!), {c['-']} better (-), "
            f"{c['x']} not comparable (x), factor {result['factor']:g}")
