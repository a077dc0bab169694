"""Whether a mutant of the Gluon forward reaches its kernel on this GPU: the unmutated subject and the
mutant on one case the mutant must fail (out rows past 64), in this process (which forward each launched)
and in a worker process as `faverify mutants` runs it (session 7: in-process the mutants failed, through
the workers they survived; this compares the two on one case).

    python3 devtools/mutant_probe.py [MUTANT]
"""
import sys

from faverify.case import Case
from faverify.inputs import make_inputs
from faverify.runner import evaluate
from faverify.subjects import resolve

CASE = Case(1, 129, 129, 2, 2, 64, dtype="bf16", seed=1)


def in_process(name: str) -> None:
    for kernel in ("triton", f"mutant:{name}"):
        subject = resolve(kernel)
        r = evaluate(subject, CASE, "cuda", mode="fwd")
        func = next(c.cell_contents for c in subject.fn.__closure__
                    if getattr(c.cell_contents, "__name__", "") == "flash_attn_func")
        itf = sys.modules[func.__module__]
        x = make_inputs(CASE, "cuda")
        tma = itf._use_tma(x.q, x.k, x.v)
        jit = itf._fwd_hopper.kernel(CASE.seqlen_q, CASE.seqlen_k)
        print(f"{kernel}: {r.status} {r.reason[:160]!r}; interface {itf.__name__}, _use_tma {tma}, "
              f"_use_hopper {itf._use_hopper(x.q, tma)}, gluon module {itf._fwd_hopper.__name__}, "
              f"compiled {[len(c[0]) for c in jit.device_caches.values()]}, key {jit.cache_key[:12]}", flush=True)


def in_workers(name: str) -> None:
    from faverify.isolation import Worker
    from faverify.verdict import Tolerance
    for kernel in ("triton", f"mutant:{name}", "mutant:no-final-division"):
        worker = Worker(kernel, "cuda:0", "fwd", Tolerance().to_dict(), 300.0)
        r = worker.evaluate(CASE)
        worker.stop()
        print(f"{kernel} in a worker: {r.status} {r.reason[:160]!r}", flush=True)


if __name__ == "__main__":  # (workers are spawned: they re-import this file)
    mutant = sys.argv[1] if len(sys.argv) > 1 else "ws-consumer-rows"
    in_process(mutant)
    in_workers(mutant)
