"""Where does a fuzz case's time go? cProfile over N evaluated cases (after a warm-up), then the top CUDA
kernels from torch.profiler.  python3 devtools/profile_cases.py KERNEL N"""
import cProfile
import io
import pstats
import sys
import time
import warnings

import torch
from hypothesis import HealthCheck, given, seed, settings

from faverify.cases.strategies import GPU_LIMITS, cases
from faverify.run.evaluate import evaluate
from faverify.subjects import resolve

warnings.simplefilter("ignore")
name, n = sys.argv[1], int(sys.argv[2])
subject = resolve(name)
drawn = []


@seed(1)
@settings(max_examples=n + 10, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(cases(limits=GPU_LIMITS, dtypes=("bf16", "fp16")))
def draw(c):
    drawn.append(c)


draw()
for c in drawn[:10]:
    evaluate(subject, c, "cuda")
prof = cProfile.Profile()
t = time.perf_counter()
prof.enable()
phases = {}
for c in drawn[10:]:
    r = evaluate(subject, c, "cuda")
    for k, v in r.phases.items():
        phases[k] = phases.get(k, 0) + v
prof.disable()
print(f"{name}: {len(drawn) - 10} cases in {time.perf_counter() - t:.2f} s; phase totals", phases)
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
print(s.getvalue()[-5000:])
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                        torch.profiler.ProfilerActivity.CUDA]) as p:
    for c in drawn[10:40]:
        evaluate(subject, c, "cuda")
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
