"""The Hopper forward as it is against another version of hopper/forward.py (a file, e.g. from
`git show REV:kernels/triton/hopper/forward.py`), in one process: each launches in place of
hopper.forward.kernel's choice (Launch.hopper_build). First the bits: out and lse of every valid row must be
equal (the numerics are meant not to change), at bench's shapes and at ragged ones. Then the speed at
bench's shapes, the two alternating, with sdpa-cudnn in the same process; the spread between repeats is
the noise. GPU (sm_90).

    python3 devtools/hopper_ab.py OLD_FILE [--dtype bf16] [--repeats 3] [--bits-only]
"""
import argparse
import importlib.util

import torch
import triton.testing

from faverify.commands.bench import Config
from faverify.kernels.triton import interface
from faverify.kernels.triton.hopper import forward as hopper_forward

ROWS = ((64, True, 4096), (64, True, 16384), (64, False, 4096), (128, True, 4096), (128, False, 4096))
RAGGED = ((1, 777, 1000, 4, 64, True), (2, 1000, 777, 4, 64, True), (1, 193, 193, 3, 128, True),
          (3, 4160, 4160, 2, 64, False), (1, 65, 4096, 2, 64, True), (2, 100, 120, 3, 64, False),
          (1, 130, 70, 2, 64, True), (2, 1, 129, 4, 128, False), (1, 127, 127, 1, 128, True),
          (2, 70, 130, 2, 64, True))  # (b, sq, sk, h, d, causal)


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


def load(path):
    spec = importlib.util.spec_from_file_location("hopper_forward_other", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.kernel


def main():
    p = argparse.ArgumentParser()
    p.add_argument("old")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bits-only", action="store_true", help="compare the bits, time nothing")
    a = p.parse_args()
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    builds = {"new": hopper_forward.kernel, "old": load(a.old)}

    def run(name, q, k, v, causal):
        return interface.forward(q, k, v, q.shape[-1] ** -0.5, causal, "-inf",
                                 launch=interface.Launch(hopper_build=builds[name]))

    same = True
    rows = (Config(a.dtype, *row) for row in ROWS)  # bench's shapes
    for b, sq, sk, h, d, causal in RAGGED + tuple((c.batch, c.seqlen, c.seqlen, c.nheads, c.head_dim, c.causal)
                                                  for c in rows):
        torch.manual_seed(0)
        q = torch.randn(b, sq, h, d, device="cuda", dtype=dt)
        k, v = (torch.randn(b, sk, h, d, device="cuda", dtype=dt) for _ in range(2))
        (o1, l1, _), (o2, l2, _) = run("new", q, k, v, causal), run("old", q, k, v, causal)
        eq = torch.equal(o1, o2) and torch.equal(l1, l2)
        same &= eq
        print(f"bits b{b} sq{sq} sk{sk} h{h} d{d} causal={causal}: {'same' if eq else 'DIFFER'}", flush=True)
    print("bits: all same" if same else "bits: DIFFER", flush=True)
    if a.bits_only:
        return

    for d, causal, n in ROWS:
        cfg, (q, k, v), cudnn = bench_row(a.dtype, d, causal, n)
        for repeat in range(a.repeats):
            for name in builds:
                tf = cfg.flops("fwd") / bench(lambda: run(name, q, k, v, causal)) * 1e-9
                print(f"  {name} run {repeat + 1}: {tf:6.1f} TF/s, {tf / cudnn:.3f}x cudnn", flush=True)


if __name__ == "__main__":
    main()
