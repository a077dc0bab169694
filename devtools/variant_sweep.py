"""Time the Triton variant kernels (variant/forward.py, variant/backward.py) over tile candidates of their
fast build, next to their generic build, the dense Triton kernels and sdpa-cudnn in the same process, on
faverify bench's shapes (16384 tokens, nheads * head_dim = 2048). GPU only.

    python3 devtools/variant_sweep.py [--headdims 64,128] [--seqlen 16384] [--variants alibi,softcap=30]
                                      [--dtype bf16] [--json F]

Each kernel's candidates are timed with the others at their default (configs._FAST): the forward alone,
and the backward (dk/dv then dq) whole, one kernel's tile varied at a time. Every candidate's out, dq, dk
and dv are compared with the generic build's (max abs difference, printed): a tile changes the order of
sums, not the result.
"""
import argparse
import json
import math

import torch
import triton.testing

from faverify.commands.bench import Config
from faverify.kernels.triton import configs
from faverify.kernels.triton.configs import Tile
from faverify.kernels.triton.variant import interface as vinterface

CANDIDATES = {
    64: {"fwd": [Tile(128, 64, 8, 2), Tile(128, 64, 4, 2), Tile(128, 64, 8, 3), Tile(64, 64, 4, 2)],
         "dkdv": [Tile(32, 128, 8, 2), Tile(32, 64, 4, 2), Tile(64, 128, 8, 2), Tile(32, 128, 4, 2),
                  Tile(32, 128, 8, 3)],
         "dq": [Tile(128, 64, 8, 2), Tile(64, 64, 4, 2), Tile(128, 64, 8, 3), Tile(128, 128, 8, 2)]},
    128: {"fwd": [Tile(128, 64, 8, 2), Tile(128, 64, 8, 3), Tile(64, 64, 4, 2), Tile(128, 32, 4, 2)],
          "dkdv": [Tile(16, 128, 8, 2), Tile(32, 128, 8, 2), Tile(64, 128, 8, 2), Tile(32, 64, 8, 2),
                   Tile(16, 64, 8, 2), Tile(32, 128, 8, 1)],
          "dq": [Tile(128, 64, 8, 2), Tile(128, 64, 8, 3), Tile(64, 64, 4, 2), Tile(64, 32, 4, 2)]},
}


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def inputs(cfg: Config, dt):
    b, h, n, d = cfg.batch, cfg.nheads, cfg.seqlen, cfg.head_dim
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=dt, generator=g) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    fields = cfg.fields()
    window = fields.get("window", (-1, -1))
    alibi = (torch.rand(h, device="cuda", generator=g) * 0.1) if "alibi" in fields else None
    sinks = torch.randn(h, device="cuda", generator=g).requires_grad_(True) if "sinks" in fields else None
    var = vinterface.KernelVariant.of(d ** -0.5, cfg.causal, window, fields.get("softcap", 0.0), alibi, sinks)
    return q, k, v, do, var


def run_once(q, k, v, do, var):
    out = vinterface.attention(q, k, v, var)[0]
    return out, torch.autograd.grad(out, (q, k, v), do, retain_graph=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--headdims", default="64,128")
    p.add_argument("--seqlen", type=int, default=16384)
    p.add_argument("--variants", default="alibi,softcap=30")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    rows = []
    fast_build = vinterface.fast_build
    for d in map(int, a.headdims.split(",")):
        # the cuDNN and dense Triton yardsticks of this shape
        cfg = Config(a.dtype, d, True, a.seqlen)
        q, k, v, do, _ = inputs(cfg, dt)
        qt, kt, vt = (t.detach().transpose(1, 2) for t in (q, k, v))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            cudnn = bench(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True))
        from faverify.kernels.triton import interface
        out, _ = interface.flash_attn_func(q, k, v, causal=True, return_lse=True)
        dense_bwd = bench(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))
        print(f"d{d}: sdpa-cudnn fwd {cfg.flops('fwd') / cudnn * 1e-9:.0f} TF/s; triton dense bwd "
              f"{cfg.flops('bwd') / dense_bwd * 1e-9:.0f} TF/s", flush=True)
        for name in a.variants.split(","):
            cfg = Config(a.dtype, d, True, a.seqlen, name)
            q, k, v, do, var = inputs(cfg, dt)
            vinterface.fast_build = lambda *t: False
            ref_out, ref_grads = run_once(q, k, v, do, var)
            generic = (bench(lambda: vinterface.attention(q, k, v, var)),
                       bench(lambda: torch.autograd.grad(ref_out, (q, k, v), do, retain_graph=True)))
            vinterface.fast_build = fast_build
            print(f"d{d} {name}: generic fwd {cfg.flops('fwd') / generic[0] * 1e-9:.1f} bwd "
                  f"{cfg.flops('bwd') / generic[1] * 1e-9:.1f} TF/s", flush=True)
            rows.append({"d": d, "variant": name, "kind": "generic", "fwd_ms": generic[0], "bwd_ms": generic[1]})
            default = dict(configs._FAST[d])
            for kind, tiles in CANDIDATES[d].items():
                for tile in tiles:
                    configs._FAST[d] = {**default, kind: tile}
                    try:
                        out, grads = run_once(q, k, v, do, var)
                        diff = max(float((x.float() - y.float()).abs().max()) for x, y in
                                   zip((out, *grads), (ref_out, *ref_grads)))
                        if kind == "fwd":
                            ms = bench(lambda: vinterface.attention(q, k, v, var))
                            tflops = cfg.flops("fwd") / ms * 1e-9
                        else:
                            ms = bench(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))
                            tflops = cfg.flops("bwd") / ms * 1e-9
                        row = {"d": d, "variant": name, "kind": kind, "tile": str(tile), "ms": ms,
                               "tflops": tflops, "max_diff_vs_generic": diff}
                        print(f"d{d} {name} {kind} {tile}: {tflops:.1f} TF/s ({ms:.3f} ms), diff {diff:.3g}",
                              flush=True)
                    except Exception as e:  # a tile that does not build is reported, the others still run
                        row = {"d": d, "variant": name, "kind": kind, "tile": str(tile), "error": str(e)[:200]}
                        print(f"d{d} {name} {kind} {tile}: {type(e).__name__} {str(e)[:150]}", flush=True)
                    rows.append(row)
                    if a.json:
                        with open(a.json, "w") as f:
                            json.dump(rows, f, indent=1)
            configs._FAST[d] = default
    best = {}
    for r in rows:
        if "tflops" in r and math.isfinite(r["tflops"]):
            key = (r["d"], r["variant"], r["kind"])
            best[key] = max(best.get(key, (0, "")), (r["tflops"], r["tile"]))
    for key, (tf, tile) in sorted(best.items()):
        print("best", *key, tile, f"{tf:.1f}")


if __name__ == "__main__":
    main()
