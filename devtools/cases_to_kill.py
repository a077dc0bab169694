"""How many drawn cases until a subject first fails: the seeded draw of `faverify fuzz` (strategies.cases with
the features given), evaluated in order on the CPU, for each of several seeds; prints the index of the first
failing case per seed (1-based; "-" if none within N) and the median.

    python devtools/cases_to_kill.py property_tests.planted:window_off_by_one --features window --dtype fp32
"""
import argparse
import os
import statistics
import sys
import warnings

from hypothesis import HealthCheck, given, seed, settings


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("kernel")
    p.add_argument("--features", default="")
    p.add_argument("--dtype", default="bf16,fp16")
    p.add_argument("--mode", default="both")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--seeds", type=int, default=5)
    a = p.parse_args()
    os.environ.setdefault("TRITON_INTERPRET", "1")
    warnings.simplefilter("ignore")
    sys.path.insert(0, os.getcwd())
    from faverify.cases.strategies import cases
    from faverify.run.evaluate import evaluate
    from faverify.subjects import resolve

    subject = resolve(a.kernel)
    features = tuple(f for f in a.features.split(",") if f)
    firsts = []
    for s in range(a.seeds):
        drawn = []

        @seed(s)
        @settings(max_examples=a.n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(cases(dtypes=tuple(a.dtype.split(",")), features=features))
        def draw(c):
            drawn.append(c)
        draw()
        first = next((i + 1 for i, c in enumerate(drawn) if evaluate(subject, c, "cpu", mode=a.mode).failed), None)
        firsts.append(first)
    found = [f for f in firsts if f is not None]
    median = statistics.median(found) if found else None
    print(f"{a.kernel}: first failing case per seed {['-' if f is None else f for f in firsts]}, "
          f"median {median}, killed on {len(found)} of {a.seeds} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
