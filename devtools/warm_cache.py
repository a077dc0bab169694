"""Does Triton on this GPU load the builds `faverify warmup` compiled on another machine?

    faverify warmup --target sm_90 --cache-dir D --json D/warmup.json     (any machine: the CPU one)
    python3 devtools/warm_cache.py D [--kernel triton] [--cases 200] [--seed 0] [--dtype bf16,fp16]
                                     [--features F] [--mode both]                          (the GPU)

First compares what every build's key holds beside the build itself (builds.key_fields: Triton's version
and its own hash, over its sources and libtriton, whose wheel is built per Python; the Python ABI; ptxas's
version and the arch; the environment variables that change a compile) between D/warmup.json and this
machine. Then evaluates the first N cases of the fuzz's draw in this process with TRITON_CACHE_DIR=D, the
gradient check every 25th as a fuzz runs it, and counts the builds loaded from D and those compiled here.
For each compiled one it names the parts of the key (builds.key_parts) that differ from the build of the
same source in D, or says that D has no build of that source (the warm-up did not list it: its
specialization differs)."""
import argparse
import json
import os
import sys
import warnings

ap = argparse.ArgumentParser()
ap.add_argument("cache")
ap.add_argument("--kernel", default="triton")
ap.add_argument("--cases", type=int, default=200)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--features", default=None)
ap.add_argument("--dtype", default="bf16,fp16")
ap.add_argument("--mode", default="both")
a = ap.parse_args()
os.environ["TRITON_CACHE_DIR"] = os.path.abspath(a.cache)  # before Triton reads it

from triton import knobs  # noqa: E402

from faverify.cases.strategies import limits_for  # noqa: E402
from faverify.commands.fuzz import parse_features  # noqa: E402
from faverify.kernels.triton.build import builds, target  # noqa: E402
from faverify.run.draw import draw_cases  # noqa: E402
from faverify.run.evaluate import evaluate  # noqa: E402
from faverify.run.plan import FuzzPlan  # noqa: E402
from faverify.subjects import resolve  # noqa: E402

warnings.simplefilter("ignore")
with open(os.path.join(a.cache, "warmup.json")) as f:
    there = json.load(f)
here = builds.key_fields(target.of_device("cuda"))
print(f"cache {a.cache}: {len(there['built'])} builds for {there['target']}")
for field in sorted(set(here) | set(there["fields"])):
    same = here.get(field) == there["fields"].get(field)
    print(f"  {field:12s} {'same' if same else 'DIFFERS'}: here {str(here.get(field))[-60:]!r}"
          + ("" if same else f", there {str(there['fields'].get(field))[-60:]!r}"))
by_source: dict = {}
for b in there["built"]:
    by_source.setdefault((b["kernel"], b["parts"].get("source")), b)

met: list = []  # (kernel, key, parts) of the build whose compile runs now, then its outcome
outcomes: dict = {}  # key -> (kernel, parts, loaded?, case index)
now = {"case": -1}


def before(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
    jit = fn.jit_function
    src, options, _, backend = builds._source(jit, compile)
    met.append((f"{jit.fn.__module__}.{jit.fn.__qualname__}", builds.cache_key(src, backend, options),
                builds.key_parts(src, backend, options)))
    return None  # compile (or load) as always


def listen(*, cache_hit=False, **_):
    if met:
        kernel, key, parts = met.pop()
        outcomes.setdefault(key, (kernel, parts, bool(cache_hit), now["case"]))


knobs.runtime.jit_cache_hook, knobs.compilation.listener = before, listen
subject = resolve(a.kernel)
wanted = parse_features(a.features)
plan = FuzzPlan(iters=a.cases, seed=a.seed, dtypes=tuple(a.dtype.split(",")), limits=limits_for("cuda"), database=None,
                features=subject.caps.features() if wanted is None else wanted, narrow=subject.caps.draw() or None)
for i, case in enumerate(draw_cases(plan)):
    now["case"] = i
    evaluate(subject, case, "cuda", mode=a.mode, gradcheck=i % 25 == 0 and a.mode != "fwd")
loaded = [k for k, o in outcomes.items() if o[2]]
compiled = [k for k, o in outcomes.items() if not o[2]]
print(f"{a.cases} cases: {len(outcomes)} builds, {len(loaded)} loaded from the cache, {len(compiled)} compiled here")
for key in compiled[:20]:
    kernel, parts, _, index = outcomes[key]
    twin = by_source.get((kernel, parts["source"]))
    why = ("the cache has no build of this source (the warm-up did not list it)" if twin is None else
           "differs in " + ", ".join(p for p in parts if parts[p] != twin["parts"].get(p)))
    print(f"  {kernel} {key[:12]} (case {index}): {why}")
sys.exit(1 if compiled else 0)
