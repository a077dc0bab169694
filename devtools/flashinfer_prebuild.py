"""Build the FlashInfer JIT modules a fuzz of the flashinfer subject reaches, in one ninja run over every
core, before the fuzz: each worker would otherwise build its first cases' modules itself, several minutes
each (a 400-case fuzz on the H200 judged no case in 150 s, four sm90 modules still building).

The subject (faverify/subjects/flashinfer.py) calls single_prefill_with_kv_cache, the ragged and paged
batch prefill wrappers and the paged batch decode wrapper, with window_left (sliding window) and
logits_soft_cap on or off, no position encoding, q, k and v in one 16-bit dtype and equal head dims. Per
dtype, head dim, window and softcap: the single prefill module and FlashInfer's own AOT list (flashinfer.aot
gen_fa3: batch prefill for sm_90, the backend "auto" takes there; gen_fa2: the decode, and with --backends
fa2 the sm_80 prefills).

    python3 devtools/flashinfer_prebuild.py [--dtypes bf16] [--headdims 64,128,256] [--backends fa3] [--list]

--list prints the modules' names and builds nothing (FLASHINFER_CUDA_ARCH_LIST, e.g. 9.0a, stands in for a
GPU). A later fuzz logs "Building JIT module" for any module this list missed.
"""
import argparse
import itertools
import time

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def specs(dtypes, head_dims, backends) -> list:
    """The modules' JitSpecs: single and batch prefill for each backend, and the decode (its own kernel
    whatever the backend)."""
    from flashinfer.aot import gen_fa2, gen_fa3
    from flashinfer.jit.attention.modules import gen_single_prefill_module
    out = []
    for dtype, d, window, cap in itertools.product(dtypes, head_dims, (False, True), (False, True)):
        for backend in backends:
            out.append(gen_single_prefill_module(backend, dtype, dtype, dtype, d, d, 0, window, cap, False))
        fa2 = list(gen_fa2(dtype, dtype, d, d, window, cap))  # the fa2 batch prefill, then the decode
        out += fa2 if "fa2" in backends else [s for s in fa2 if s.name.startswith("batch_decode")]
        if "fa3" in backends:
            out += list(gen_fa3(dtype, dtype, dtype, d, d, window, cap))
    return list({s.name: s for s in out}.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", default="bf16,fp16")
    p.add_argument("--headdims", default="64,128,256")
    p.add_argument("--backends", default="fa3", help="fa3 (what backend='auto' takes on sm_90), fa2, or both")
    p.add_argument("--list", action="store_true")
    a = p.parse_args()
    chosen = specs([DTYPES[d] for d in a.dtypes.split(",")], [int(d) for d in a.headdims.split(",")],
                   a.backends.split(","))
    for s in chosen:
        print(s.name, flush=True)
    if a.list:
        return
    from flashinfer.jit.core import build_jit_specs
    start = time.perf_counter()
    build_jit_specs(chosen, verbose=False)
    print(f"{len(chosen)} modules built in {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
