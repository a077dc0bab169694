"""Whether a mutant of the Gluon forward reaches its kernel on this GPU: the unmutated subject and the
mutant on one case the mutant must fail (out rows past 64), in this process; which forward each launched.

    python3 devtools/mutant_probe.py [MUTANT]
"""
import sys

from faverify.case import Case
from faverify.inputs import make_inputs
from faverify.runner import evaluate
from faverify.subjects import resolve

name = sys.argv[1] if len(sys.argv) > 1 else "ws-consumer-rows"
case = Case(1, 129, 129, 2, 2, 64, dtype="bf16", seed=1)
for kernel in ("triton", f"mutant:{name}"):
    subject = resolve(kernel)
    r = evaluate(subject, case, "cuda", mode="fwd")
    func = next(c.cell_contents for c in subject.fn.__closure__
                if getattr(c.cell_contents, "__name__", "") == "flash_attn_func")
    itf = sys.modules[func.__module__]
    x = make_inputs(case, "cuda")
    tma = itf._use_tma(x.q, x.k, x.v)
    jit = itf._fwd_hopper._fwd_hopper
    print(f"{kernel}: {r.status} {r.reason[:160]!r}; interface {itf.__name__}, _use_tma {tma}, "
          f"_use_hopper {itf._use_hopper(x.q, tma)}, gluon module {itf._fwd_hopper.__name__}, "
          f"compiled {[len(c[0]) for c in jit.device_caches.values()]}, key {jit.cache_key[:12]}", flush=True)
