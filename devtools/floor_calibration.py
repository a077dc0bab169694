"""How much tolerance floor do correct kernels need? Evaluates N seeded cases per subject and, per dtype and
tensor, prints what the verdict's floor term must be for each case to pass, in units of F = u(dtype) * scale_T
(docs/design.md, "Tolerance"):

    need = (max|T - ref| - carried - factor * max|baseline - ref|) / F

over the cases where the floor that shrinks with the baseline's error does not already cover it (only there
does the tight floor decide: verdict.Tolerance.terms). The verdict's tight floor (verdict.DEFAULT_TIGHT)
must stay above the largest need of every correct kernel; "decided" counts those cases.

    python devtools/floor_calibration.py --kernels sdpa-math,triton --n 300 --device cpu [--json FILE]
"""
import argparse
import json
import os
import sys
import warnings

from hypothesis import HealthCheck, given, seed, settings


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--kernels", required=True)
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtypes", default="bf16,fp16,fp32")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json")
    a = p.parse_args()
    if a.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    warnings.simplefilter("ignore")
    from faverify.cases.strategies import cases, limits_for
    from faverify.dtypes import FLOOR_UNIT
    from faverify.judge.verdict import DEFAULT_ATOL, DEFAULT_FACTOR, KNEE, TENSORS, Tolerance
    from faverify.run.evaluate import evaluate
    from faverify.subjects import resolve

    drawn = []

    @seed(a.seed)
    @settings(max_examples=a.n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(cases(limits=limits_for(a.device), dtypes=tuple(a.dtypes.split(","))))
    def draw(c):
        drawn.append(c)

    draw()
    # no floor at all: the metrics' floor is then the carried logit term alone, and every case's need shows
    bare = Tolerance(atol={t: 0.0 for t in TENSORS}, tight={t: 0.0 for t in TENSORS})
    table = {}
    for name in a.kernels.split(","):
        subject = resolve(name)
        for c in drawn:
            r = evaluate(subject, c, a.device, tolerance=bare)
            if r.status in ("crash", "timeout") or any(m.nan or m.inf or m.masked_bad for m in r.metrics.values()):
                print(f"{name}: {r.status} {r.reason[:120]}  {c.to_json()}", file=sys.stderr)
            for t, m in r.metrics.items():
                F = FLOOR_UNIT[c.dtype] * m.scale
                if m.waived or F <= 0 or m.nan or m.inf or m.masked_bad:  # a defect, not a rounding error
                    continue
                points = table.setdefault(f"{name} {c.dtype} {t}", [])  # (error - carried, B), in F
                points.append(((m.max_abs - m.floor) / F, m.baseline_max_abs / F, c.to_json()))
    print(f"{'subject dtype tensor':30s} {'cases':>6s} {'decided':>7s} {'tight >=':>9s} {'err/F max':>9s}")
    for key, points in table.items():
        t = key.split()[-1]
        # (err - factor * B) / F where it passes the shrunk full floor: there only the tight floor decides
        decided = [(e - DEFAULT_FACTOR[t] * b, c) for e, b, c in points
                   if e - DEFAULT_FACTOR[t] * b > DEFAULT_ATOL[t] * (1 - min(1.0, b / KNEE))]
        need = max(decided, default=(0.0, ""))
        print(f"{key:30s} {len(points):6d} {len(decided):7d} {need[0]:9.3f} {max(e for e, _, _ in points):9.3f}")
        if need[1]:
            print(f"    needed by {need[1]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(table, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
