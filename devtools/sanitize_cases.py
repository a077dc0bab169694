"""A handful of odd-shaped cases through the CUDA kernels' forward and backward, small enough to run under
compute-sanitizer (memcheck, racecheck): tails in every dimension, unaligned head dims, GQA, causal with
rows that see no key, strided views, GQA groups of several query tiles per head.

    compute-sanitizer --tool memcheck python3 devtools/sanitize_cases.py [mma|simt ...]
"""
import sys

import torch

from faverify.cases.case import Case
from faverify.cases.inputs import make_inputs
from faverify.kernels.cuda import flash_attn_func

CASES = [
    Case(1, 17, 113, 4, 2, 40, dtype="fp16", causal=True, seed=1),
    Case(2, 70, 33, 2, 1, 72, dtype="bf16", causal=True, seed=2, layout="transposed"),
    Case(1, 65, 129, 2, 2, 256, dtype="bf16", seed=3),
    Case(1, 1, 1, 1, 1, 3, dtype="fp16", seed=4),
    Case(1, 130, 130, 3, 3, 128, dtype="fp16", causal=True, seed=5, layout="packed"),
    # GQA with several query tiles per head: the dkdv loop steps from head to head of a group
    Case(2, 150, 140, 4, 2, 128, dtype="bf16", causal=True, seed=6),
]

VARIANTS = sys.argv[1:] or ["mma", "simt"]
for case in CASES:
    for variant in VARIANTS:
        x = make_inputs(case, "cuda", requires_grad=True)
        out = flash_attn_func(x.q, x.k, x.v, causal=case.causal, init=case.init, variant=variant)
        torch.autograd.grad(out, (x.q, x.k, x.v), x.dout)
torch.cuda.synchronize()
print(f"{len(CASES) * len(VARIANTS)} forward+backward runs done")
