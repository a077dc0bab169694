"""Time the forward over tile candidates: the warp-specialized Hopper forward (hopper: sm_90, one program per
query block, the launcher's default; hopperp: persistent, one program per SM; hopper-g<N>: heads in groups
of N in the schedule instead of hopper.layouts.HEAD_GROUP: Launch.head_group), the Triton one through
tensor descriptors (tma: every tile; tma1: the default tile) and through pointers (ptr: the default tile),
next to sdpa-cudnn and sdpa-flash in the same process, as ratios to cuDNN. GPU only.

    python3 devtools/triton_fwd_sweep.py [--dtype bf16] [--seqlens 4096,16384] [--headdims 64,128]
                                         [--paths hopper,tma,ptr] [--json F]

Shapes are faverify bench's (16384 tokens, nheads * head_dim = 2048). Before timing, each shape checks
that the TMA and pointer paths give the same bits at the pointer path's default tile.
"""
import argparse
import json
import sys
import time

import torch
import triton.testing

from faverify.commands.bench import Config
from faverify.kernels.triton import configs, interface
from faverify.kernels.triton.configs import Tile

TILES = [Tile(128, 64, 4, s) for s in (2, 3, 4)] + [Tile(128, 128, 4, s) for s in (2, 3)] \
    + [Tile(128, 128, 8, s) for s in (2, 3)] + [Tile(128, 64, 8, 3), Tile(64, 64, 4, 3), Tile(64, 64, 4, 4),
                                                Tile(64, 128, 4, 3), Tile(256, 64, 8, 2), Tile(256, 64, 8, 3),
                                                Tile(256, 128, 8, 2)]


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--seqlens", default="4096,16384")
    p.add_argument("--headdims", default="64,128")
    p.add_argument("--paths", default="hopper,tma,ptr")
    p.add_argument("--hopper-tiles", default="all", choices=("all", "default"),
                   help="the Hopper forward's tuning candidates, or only its default tile (configs.HOPPER)")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    rows = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for d in map(int, a.headdims.split(",")):
        for causal in (False, True):
            for n in map(int, a.seqlens.split(",")):
                cfg = Config(a.dtype, d, causal, n)
                b, h = cfg.batch, cfg.nheads
                q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=dt) for _ in range(3))
                qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
                flops = cfg.flops("fwd")
                ref = {}
                for name, backend in (("cudnn", torch.nn.attention.SDPBackend.CUDNN_ATTENTION),
                                      ("flash", torch.nn.attention.SDPBackend.FLASH_ATTENTION)):
                    with torch.nn.attention.sdpa_kernel(backend):
                        ref[name] = bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                            qt, kt, vt, is_causal=causal))
                scale = d ** -0.5
                same = []
                # the Triton forward's two load paths, at one tile (the paths' defaults differ: another sum order)
                pointer_tile = configs.default("fwd", d, 2, causal)
                for tma in (False, True):
                    same.append(interface.forward(q, k, v, scale, causal, "-inf", tile=pointer_tile,
                                                  launch=interface.Launch(tma=tma, hopper=False)))
                bits = all(torch.equal(x, y) for x, y in zip(same[0][:2], same[1][:2]))
                line = {"d": d, "causal": causal, "seqlen": n, "cudnn_tflops": flops / ref["cudnn"] * 1e-9,
                        "flash_tflops": flops / ref["flash"] * 1e-9, "tma_bits_equal": bits, "tiles": {}}
                print(f"d{d} causal={causal} n={n}: cudnn {line['cudnn_tflops']:.1f} flash "
                      f"{line['flash_tflops']:.1f} TF/s; TMA bits equal: {bits}", flush=True)
                for path in a.paths.split(","):
                    group = int(path[len("hopper-g"):]) if path.startswith("hopper-g") else None
                    launch = interface.Launch(tma=path != "ptr", programs=sms if path == "hopperp" else None,
                                              head_group=group)
                    hopper = [t for t in configs.tuning_candidates("fwd", d, 2, 9, True) if t.hopper]
                    hopper = hopper if a.hopper_tiles == "all" else [configs.HOPPER[d]]
                    tiles = {**{p: hopper for p in a.paths.split(",") if p.startswith("hopper")},
                             "tma": [t for t in TILES if configs.keep("fwd", t, d, 2, 9)],
                             "tma1": [configs.default("fwd", d, 2, causal, True)],
                             "ptr": [configs.default("fwd", d, 2, causal)]}[path]
                    for t in tiles:
                        name = f"{path} {t}"
                        try:
                            ms = bench(lambda: interface.forward(q, k, v, scale, causal, "-inf", tile=t,
                                                                 launch=launch))
                        except Exception as e:  # noqa: BLE001 (a tile that cannot compile is skipped)
                            print(f"   {name}: {type(e).__name__} {str(e)[:120]}", flush=True)
                            continue
                        tf = flops / ms * 1e-9
                        if path.startswith("hopper"):  # against the Triton forward's output of the same inputs
                            diff = (interface.forward(q, k, v, scale, causal, "-inf", tile=t, launch=launch)[0].float()
                                    - same[1][0].float()).abs().max().item()
                            name += f" (max|out - triton out| {diff:.2e})"
                        line["tiles"][name] = tf
                        print(f"   {name}: {tf:.1f} TF/s, {tf / line['cudnn_tflops']:.3f}x cudnn", flush=True)
                best = max(line["tiles"].items(), key=lambda kv: kv[1])
                print(f"  best {best[0]}: {best[1]:.1f} TF/s = {best[1] / line['cudnn_tflops']:.3f}x cudnn, "
                      f"{best[1] / line['flash_tflops']:.2f}x flash", flush=True)
                rows.append(line)
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"sweep done in {time.time() - t0:.0f} s", file=sys.stderr)
