"""Which cases of a mutant's fuzz reach the Gluon forward, in this process and through a worker process
(session 8: `faverify mutants` on the H200 ran 100 cases of each ws mutant and none took that path, while
the unmutated control's took it 13 times). Prints each case with the paths it took, both ways.

    python3 devtools/mutant_reach.py [MUTANT] [ITERS]
"""
import sys

from faverify.collector import KernelStats
from faverify.fuzz import FuzzPlan, fuzz_subject
from faverify.strategies import limits_for
from faverify.verdict import Tolerance


def main(name: str, iters: int) -> None:
    from faverify.isolation import Worker
    from faverify.runner import evaluate
    from faverify.subjects import resolve
    plan = FuzzPlan(iters=iters, seed=0, dtypes=("bf16", "fp16"), limits=limits_for("cuda"), database=None,
                    shrink_budget=3, stop_at_first_failure=True)
    kernel = f"mutant:{name}"
    subject = resolve(kernel)
    worker = Worker(kernel, "cuda:0", "both", Tolerance().to_dict(), 300.0)
    ways = {"in process": lambda case, gc: evaluate(subject, case, "cuda:0", gradcheck=gc),
            "worker": lambda case, gc: worker.evaluate(case, gc)}
    for way, fn in ways.items():
        log = []

        def logged(case, gc, fn=fn, log=log):
            r = fn(case, gc)
            log.append(f"  {case.short()}: {r.status} {r.paths}")
            return r
        stats = fuzz_subject(kernel, plan, logged, KernelStats(kernel))
        print(f"== {way}: {stats.cases} cases, paths {dict(stats.paths)}, failures "
              f"{[f.signature for f in stats.failures]}")
        print("\n".join(log[:30]), flush=True)
    worker.stop()


if __name__ == "__main__":  # (the worker is spawned: it re-imports this file)
    main(sys.argv[1] if len(sys.argv) > 1 else "ws-tail-tile-unmasked", int(sys.argv[2]) if len(sys.argv) > 2 else 30)
