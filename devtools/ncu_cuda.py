"""One forward and one backward of the `cuda` kernels at a bench shape, for Nsight Compute to profile (the
device's ncu reads hardware counters; METHOD.md: keep --clock-control none):

    ncu --clock-control none -k regex:'fwd|dq_kernel|dkdv' --set full python3 devtools/ncu_cuda.py 16384 128 0
"""
import sys

import torch

from faverify.bench import Config
from faverify.kernels.cuda.interface import flash_attn_func

seqlen, head_dim, causal = int(sys.argv[1]), int(sys.argv[2]), bool(int(sys.argv[3]))
c = Config("bf16", head_dim, causal, seqlen)
shape = (c.batch, seqlen, c.nheads, head_dim)
q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
for t in (q, k, v):
    t.requires_grad_()
out = flash_attn_func(q, k, v, causal=causal)
torch.autograd.grad(out, (q, k, v), do)
torch.cuda.synchronize()
