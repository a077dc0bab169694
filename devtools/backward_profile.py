"""The GPU time of each kernel of one backward at `faverify bench`'s shapes (batch x seqlen = 16384 tokens,
heads x head dim = 2048): the Triton backward (dK/dV, then dQ, and the preprocess that computes D), the
same with the Hopper dK/dV (Launch(hopper_backward=True)), and with its fast mode (dQ fused by atomics,
deterministic=False), and torch SDPA's cuDNN and flash backwards,
under torch.profiler over a few calls. Where the bundled backward spends its time against cuDNN's, kernel
by kernel. GPU only.

    python3 devtools/backward_profile.py [--dtype bf16] [--headdims 64,128] [--seqlens 4096,16384]
                                         [--calls 10]

One line per backend and shape: each kernel's mean time a call, how many times it ran, and the sum.
"""
import argparse

import torch
from backward_shapes import add_arguments, inputs  # devtools/, beside this script
from torch.profiler import ProfilerActivity, profile

from faverify.kernels.triton import interface

SDPA = {"sdpa-cudnn": "CUDNN_ATTENTION", "sdpa-flash": "FLASH_ATTENTION"}


def _kernels(call, calls: int) -> list:
    """(name, mean microseconds a call, launches a call) of every kernel `call` launches."""
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    return [(e.key, e.device_time_total / calls, e.count // calls) for e in prof.key_averages()
            if e.device_time_total > 0]


def _triton(q, k, v, do, causal, launch):
    out, _, rows = interface.forward(q, k, v, q.shape[-1] ** -0.5, causal, "-inf")
    return lambda: interface.backward(do, q, k, v, out, rows, q.shape[-1] ** -0.5, causal, launch=launch)


def _sdpa(q, k, v, do, causal, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qt, kt, vt, dot = (t.transpose(1, 2).detach().requires_grad_(True) for t in (q, k, v, do))
    with sdpa_kernel(getattr(SDPBackend, backend)):
        out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    return lambda: torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.add_argument("--calls", type=int, default=10)
    a = p.parse_args()
    for cfg, q, k, v, do in inputs(a):
        causal = cfg.causal
        backends = {"triton": _triton(q, k, v, do, causal, interface.DEFAULT),
                    "triton hopper dK/dV": _triton(q, k, v, do, causal, interface.Launch(hopper_backward=True)),
                    "triton hopper fused dQ": _triton(q, k, v, do, causal, interface.Launch(
                        hopper_backward=True, deterministic=False))}
        backends.update({name: _sdpa(q, k, v, do, causal, backend) for name, backend in SDPA.items()})
        for name, call in backends.items():
            kernels = _kernels(call, a.calls)
            total = sum(us for _, us, _ in kernels)
            print(f"{a.dtype} d{cfg.head_dim} n{cfg.seqlen} causal={causal} {name}: {total / 1e3:.3f} ms; "
                  + "; ".join(f"{key[:56]} {us:.0f} us x{count}" for key, us, count in kernels), flush=True)


if __name__ == "__main__":
    main()
