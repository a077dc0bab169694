"""Which of the Hopper forward's size arguments does its speed depend on being specialized (== 1, divisible
by 16)? Each variant builds forward_hopper._fwd_source with its own do_not_specialize, launched in place of
forward_hopper.kernel's choice ("as launched": that choice), and times the forward at faverify bench's
shapes, with sdpa-cudnn in the same process. GPU (sm_90) only.

    python3 devtools/hopper_specialize.py [--dtype bf16]
"""
import argparse

import torch
import triton.testing
from triton.experimental import gluon

from faverify.commands.bench import Config
from faverify.kernels.triton import forward_hopper, interface

SIZES = ["n_bh", "nheads", "group", "seqlen_q", "seqlen_k"]
VARIANTS = {"all specialized": [], "none specialized": SIZES, "group specialized": [s for s in SIZES if s != "group"],
            "seqlens unspecialized": ["seqlen_q", "seqlen_k"], "heads unspecialized": ["n_bh", "nheads", "group"]}


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def bench_row(dtype: str, d: int, causal: bool, n: int) -> tuple:
    """bench's inputs for one row ([b, s, h, d]) and sdpa-cudnn's forward TF/s on them, printed."""
    cfg = Config(dtype, d, causal, n)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    q, k, v = (torch.randn(cfg.batch, n, cfg.nheads, d, device="cuda", dtype=dt) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        cudnn = cfg.flops("fwd") / bench(lambda: torch.nn.functional.scaled_dot_product_attention(
            qt, kt, vt, is_causal=causal)) * 1e-9
    print(f"{dtype} d{d} causal={causal} n={n}: cudnn {cudnn:.1f} TF/s", flush=True)
    return cfg, (q, k, v), cudnn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="bf16")
    a = p.parse_args()
    launched = forward_hopper.kernel
    for d, causal, n in ((64, True, 4096), (64, True, 16384), (128, True, 4096), (64, False, 4096)):
        cfg, (q, k, v), cudnn = bench_row(a.dtype, d, causal, n)
        for repeat in (1, 2):  # twice: the spread between the repeats is the noise
            for name, unspecialized in [*VARIANTS.items(), ("as launched", None)]:
                forward_hopper.kernel = launched if unspecialized is None else (
                    lambda sq, sk, j=gluon.jit(do_not_specialize=unspecialized)(forward_hopper._fwd_source): j)
                tf = cfg.flops("fwd") / bench(lambda: interface.forward(q, k, v, d ** -0.5, causal, "-inf")) * 1e-9
                print(f"  {name:24s} run {repeat}: {tf:6.1f} TF/s, {tf / cudnn:.3f}x cudnn", flush=True)
    forward_hopper.kernel = launched


if __name__ == "__main__":
    main()
