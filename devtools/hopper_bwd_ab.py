"""The Hopper dK/dV (hopper/backward.py, Launch(hopper_backward=True)) against the Triton backward and
sdpa-cudnn's, in one process at faverify bench's shapes: first the numbers (dq, dk and dv of the two
Triton paths within bf16/fp16 rounding of each other, and the Hopper one's dk and dv the same bits on a
second run), then the whole backward's TF/s, the two alternating, three repeats each (the spread is the
noise). GPU (sm_90) only.

    python3 devtools/hopper_bwd_ab.py [--dtype bf16] [--headdims 64,128] [--seqlens 4096,16384] [--repeats 3]
"""
import argparse

import torch
import triton.testing
from backward_shapes import add_arguments, inputs  # devtools/, beside this script

from faverify.kernels.triton import interface


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median")


def grads(q, k, v, do, causal, launch):
    out = interface.flash_attn_func(q, k, v, causal=causal, launch=launch)
    return out, torch.autograd.grad(out, (q, k, v), do, retain_graph=True)


def main():
    p = argparse.ArgumentParser()
    add_arguments(p)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    hopper = interface.Launch(hopper_backward=True)
    for cfg, q, k, v, do in inputs(a):
        d, n, causal = cfg.head_dim, cfg.seqlen, cfg.causal
        for t in (q, k, v):
            t.requires_grad_(True)
        out_t, ref = grads(q, k, v, do, causal, interface.DEFAULT)
        out_h, got = grads(q, k, v, do, causal, hopper)
        assert "bwd hopper" in interface.take_paths()
        diff = max(float((x.float() - y.float()).abs().max()) for x, y in zip(got, ref))
        _, again = grads(q, k, v, do, causal, hopper)
        same = all(torch.equal(x, y) for x, y in zip(got[1:], again[1:]))
        qt, kt, vt, dot = (t.detach().transpose(1, 2).requires_grad_(True) for t in (q, k, v, do))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            out_c = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            cudnn = cfg.flops("bwd") / bench(lambda: torch.autograd.grad(out_c, (qt, kt, vt), dot,
                                                                          retain_graph=True)) * 1e-9
        print(f"{a.dtype} d{d} n{n} causal={causal}: max |hopper - triton| {diff:.3g}, dk/dv bits "
              f"{'same' if same else 'DIFFER'} on a second run; cudnn bwd {cudnn:.1f} TF/s", flush=True)
        for repeat in range(a.repeats):
            for name, out, launch in (("triton", out_t, interface.DEFAULT), ("hopper", out_h, hopper)):
                ms = bench(lambda: interface.backward(do, q.detach(), k.detach(), v.detach(), out.detach(),
                                                      _rows(q, k, v, causal), d ** -0.5, causal,
                                                      launch=launch))
                tf = cfg.flops("bwd") / ms * 1e-9
                print(f"  {name} run {repeat + 1}: {tf:6.1f} TF/s, {tf / cudnn:.3f}x cudnn", flush=True)


_ROWS: dict = {}


def _rows(q, k, v, causal):
    """The forward's row max and log2 l for these inputs (computed once)."""
    key = (q.data_ptr(), causal)
    if key not in _ROWS:
        _ROWS.clear()
        _, _, rows = interface.forward(q.detach(), k.detach(), v.detach(), q.shape[-1] ** -0.5, causal, "-inf")
        _ROWS[key] = rows
    return _ROWS[key]


if __name__ == "__main__":
    main()
