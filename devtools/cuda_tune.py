"""Time the CUDA kernels built with tile overrides, on the GPU: one variant per process, since the overrides
are read from $FAVERIFY_CUDA_DEFINES when the library is built (kernels/cuda/build.py).

    FAVERIFY_CUDA_DEFINES="-DFA_FWD_BN128=48" python3 devtools/cuda_tune.py --label bn48

Prints one JSON line per shape: forward and backward ms and TF/s (bench.py's shapes and FLOP counts), the
backward's time per kernel (torch.profiler), and the largest error against the FP64 reference on small
odd-shaped cases (a variant that is fast but wrong shows there, before any fuzz run). sdpa-flash is timed
in the same process for the ratio.
"""
import argparse
import contextlib
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from faverify.commands.bench import Config, _time
from faverify.judge.reference import reference
from faverify.kernels.cuda.interface import flash_attn_func

DT = {"bf16": torch.bfloat16, "fp16": torch.float16}


def worst_error(dtype) -> float:
    """max |kernel - FP64| / max |FP64| over out, dq, dk, dv, on shapes that are not multiples of a tile."""
    worst = 0.0
    for (b, sq, sk, h, hk, d, causal) in [(2, 257, 389, 4, 2, 128, True), (1, 389, 203, 2, 1, 128, False),
                                          (1, 129, 1023, 2, 2, 64, True), (1, 77, 77, 2, 2, 256, True)]:
        g = torch.Generator(device="cuda").manual_seed(sq * 7 + sk)
        q = torch.randn(b, sq, h, d, device="cuda", generator=g).to(dtype).requires_grad_()
        k = torch.randn(b, sk, hk, d, device="cuda", generator=g).to(dtype).requires_grad_()
        v = torch.randn(b, sk, hk, d, device="cuda", generator=g).to(dtype).requires_grad_()
        do = torch.randn(b, sq, h, d, device="cuda", generator=g).to(dtype)
        out = flash_attn_func(q, k, v, causal=causal)
        out.backward(do)
        mine = (out, q.grad, k.grad, v.grad)
        ref, _ = reference(q.detach().double(), k.detach().double(), v.detach().double(), do.double(),
                           causal=causal, scale=d ** -0.5)
        for x, r in zip(mine, (ref["out"], ref["dq"], ref["dk"], ref["dv"])):
            worst = max(worst, ((x.double() - r).abs().max() / r.abs().max().clamp_min(1e-30)).item())
    return worst


def kernel_times(fn) -> dict:
    """Device time per kernel name (ms) of one call of fn, after a warm-up call."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.device_time_total > 0:
            name = e.key.split("<")[0].split("(")[0][-40:]
            out[name] = round(out.get(name, 0.0) + e.device_time_total / 1000, 3)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", default=os.environ.get("FAVERIFY_CUDA_DEFINES", "default"))
    parser.add_argument("--seqlens", default="4096,16384")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    print(json.dumps({"label": args.label, "worst_rel_error": worst_error(DT[args.dtype])}), flush=True)
    for causal in (False, True):
        for seqlen in map(int, args.seqlens.split(",")):
            c = Config(args.dtype, args.head_dim, causal, seqlen)
            shape = (c.batch, seqlen, c.nheads, args.head_dim)
            q, k, v, do = (torch.randn(shape, device="cuda", dtype=DT[args.dtype]) for _ in range(4))
            for t in (q, k, v):
                t.requires_grad_()
            row = {"label": args.label, "causal": causal, "seqlen": seqlen}
            for name, fn in (("cuda", lambda: flash_attn_func(q, k, v, causal=causal)),
                             ("flash", lambda: F.scaled_dot_product_attention(
                                 q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal))):
                ctx = sdpa_kernel(SDPBackend.FLASH_ATTENTION) if name == "flash" else contextlib.nullcontext()
                with ctx:
                    out = fn()
                    grad = do if name == "cuda" else do.transpose(1, 2)
                    fwd = _time(fn)
                    bwd = _time(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True))
                    if name == "cuda":
                        row["bwd_kernels_ms"] = kernel_times(
                            lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True))
                row[f"{name}_fwd_tflops"] = round(c.flops("fwd") / fwd * 1e-9, 1)
                row[f"{name}_bwd_tflops"] = round(c.flops("bwd") / bwd * 1e-9, 1)
            row["fwd_vs_flash"] = round(row["cuda_fwd_tflops"] / row["flash_fwd_tflops"], 3)
            row["bwd_vs_flash"] = round(row["cuda_bwd_tflops"] / row["flash_bwd_tflops"], 3)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
