"""One forward and one backward of a bundled kernel (or an SDPA backend) at a bench shape, for Nsight Compute
to profile (the device's ncu reads hardware counters; keep --clock-control none, so the clocks are the
ones a bench sees):

    ncu --clock-control none -k regex:'fwd|dq_kernel|dkdv' --set full python3 devtools/ncu_cuda.py 16384 128 0
    ncu --clock-control none -k regex:'_fwd|cudnn|sm90' python3 devtools/ncu_cuda.py 16384 128 0 triton

The fourth argument picks the kernel: cuda (default), triton, or an SDPA backend (flash, cudnn, efficient).
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from faverify.commands.bench import Config

seqlen, head_dim, causal = int(sys.argv[1]), int(sys.argv[2]), bool(int(sys.argv[3]))
which = sys.argv[4] if len(sys.argv) > 4 else "cuda"
c = Config("bf16", head_dim, causal, seqlen)
shape = (c.batch, seqlen, c.nheads, head_dim)
q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
for t in (q, k, v):
    t.requires_grad_()
if which in ("cuda", "triton"):
    from faverify.kernels.cuda.interface import flash_attn_func as cuda_attn
    from faverify.kernels.triton import flash_attn_func as triton_attn

    out = (cuda_attn if which == "cuda" else triton_attn)(q, k, v, causal=causal)
    torch.autograd.grad(out, (q, k, v), do)
else:
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION}[which]
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=causal)
        torch.autograd.grad(out, (q, k, v), do.transpose(1, 2))
torch.cuda.synchronize()
