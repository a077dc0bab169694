"""Which Triton builds does a fuzz compile after its warm-up, and where does a case's time go?

    python3 devtools/compile_census.py KERNEL N [--features F] [--seed S]

Runs the subject's warm-up cases (request.SubjectPlan.warmup_cases) in this process, then evaluates the first N
cases of the fuzz draw for bf16 and fp16 (the CLI's default features for the kernel unless --features),
recording every compile Triton does (knobs.runtime.jit_post_compile_hook). Prints each build compiled
after the warm-up with the first case that needed it, the seconds spent in cases that compiled and in
those that did not, and the verifier's phase totals. A build compiled after the warm-up is compiled again
in every worker that meets it: the warm-up should hold a case for it."""
import argparse
import time
import warnings
from collections import Counter

from triton import knobs

from faverify.cases.strategies import limits_for
from faverify.commands.fuzz import parse_features
from faverify.run.draw import draw_cases
from faverify.run.evaluate import evaluate, exercise
from faverify.run.plan import FuzzPlan
from faverify.run.request import SubjectPlan
from faverify.subjects import resolve

warnings.simplefilter("ignore")
ap = argparse.ArgumentParser()
ap.add_argument("kernel")
ap.add_argument("n", type=int)
ap.add_argument("--features", default=None)
ap.add_argument("--seed", type=int, default=0)
a = ap.parse_args()

subject = resolve(a.kernel)
wanted = parse_features(a.features)
features = subject.caps.features() if wanted is None else wanted
plan = FuzzPlan(iters=a.n, seed=a.seed, dtypes=("bf16", "fp16"), limits=limits_for("cuda", None), database=None,
                features=features)
compiled: list = []


def hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
    """Record a build as (kernel, its cache key, a dict of what makes it: constants, argument types, attributes
    such as divisibility, warps and stages), named by the kernel's parameters."""
    names = fn.jit_function.arg_names
    consts = {names[k[0]] if isinstance(k, tuple) else str(k): v for k, v in compile["constants"].items()}
    sig = {str(k): str(v) for k, v in compile["signature"].items() if str(k) not in consts}
    attrs = {names[k[0]] if isinstance(k, tuple) else str(k): str(v) for k, v in compile["configs"][0].items()}
    made = dict(consts, **{f"type {k}": v for k, v in sig.items()}, **{f"attr {k}": v for k, v in attrs.items()},
                warps=compile["num_warps"], stages=compile["num_stages"])
    compiled.append((fn.name, str(key), made))
    return None


def nearest_diff(build, warm_builds) -> str:
    """What tells a build from the warm-up's closest build of the same kernel."""
    name, _, made = build
    best = None
    for other_name, _, other in warm_builds:
        if other_name != name:
            continue
        diff = {k: (other.get(k), made.get(k)) for k in set(made) | set(other) if str(made.get(k)) != str(other.get(k))}
        if best is None or len(diff) < len(best):
            best = diff
    return "no warm build of this kernel" if best is None else "; ".join(
        f"{k}: warm {a} here {b}" for k, (a, b) in sorted(best.items()))


knobs.runtime.jit_post_compile_hook = hook
t = time.perf_counter()
warm = SubjectPlan(subject, plan).warmup_cases()
for c in warm:
    try:
        exercise(subject, c, "cuda")
    except Exception as e:  # reported, as the fuzz's warm-up would
        print("warm-up case raised", type(e).__name__, str(e)[:200], c.to_dict())
print(f"warm-up: {len(warm)} cases, {len(compiled)} compiles, {time.perf_counter() - t:.1f} s")
warm_builds = list(compiled)
warmed = {b[1] for b in compiled}
compiled.clear()

cases = draw_cases(plan)
first_case: dict = {}
t_compiling = t_plain = 0.0
n_compiling = 0
phases: Counter = Counter()
slow: list = []
for i, c in enumerate(cases):
    before = len(compiled)
    t0 = time.perf_counter()
    r = evaluate(subject, c, "cuda")
    dt = time.perf_counter() - t0
    phases.update(r.phases)
    new = compiled[before:]
    if new:
        n_compiling += 1
        t_compiling += dt
        for b in new:
            if b[1] not in first_case:
                first_case[b[1]] = (b, i, c)
    else:
        t_plain += dt
        slow.append((dt, i, r.status, c))
print(f"{len(cases)} cases: {n_compiling} compiled ({t_compiling:.1f} s), {len(cases) - n_compiling} did not "
      f"({t_plain:.1f} s, {t_plain / max(1, len(cases) - n_compiling) * 1000:.1f} ms a case)")
print("phase totals (s):", {k: round(v, 2) for k, v in phases.items()})
missed = [k for k in first_case if k not in warmed]
print(f"builds compiled after the warm-up: {len(first_case)}, of them not among the warm-up's: {len(missed)}")
for k in missed:
    b, i, c = first_case[k]
    print("--", b[0], "differs from the warm-up's nearest build in:", nearest_diff(b, warm_builds)[:700])
    print("   first case", i, c.to_dict())
print("slowest cases that compiled nothing:")
for dt, i, status, c in sorted(slow, key=lambda s: -s[0])[:5]:
    print(f"   {dt * 1000:.0f} ms case {i} {status} {c.to_dict()}")
