"""Time the packed decode kernel (variant.decode._decode) over tile candidates and split counts on
`faverify bench --decode`'s configurations (GQA 8, batch x cache = 131072 tokens, pages in a random order),
in one process, next to the default tile (configs.decode) and the split rule's count (num_splits_for).
GPU only: under the interpreter it runs, slowly, with --tokens small.

    python3 devtools/decode_sweep.py [--headdims 128] [--dtype bf16] [--pages 16,64]
                                     [--caches 4096,16384,65536,131072] [--splits 1,2,4,8,16,32]
                                     [--tokens N] [--no-tiles]
                                     [--json F]

--splits: multiples of the rule's split count (and MAX_SPLITS), timed with the default tile; then every tile
at the fastest count. Each call is timed replaying a CUDA graph, as bench --decode times it (bench.graphed:
a call's host work outlasts the kernel). Each candidate's out is compared with the default's (max abs
difference, printed): a tile and a split count change the order of sums, not the result. The cache read's
bandwidth is over the device copy bandwidth measured first, as bench --decode reports it.
"""
import argparse
import dataclasses
import itertools
import json

import torch

from faverify.cases.inputs import make_inputs
from faverify.cases.vocabulary import MAX_SPLITS
from faverify.commands import bench_decode
from faverify.commands.bench import time_forward
from faverify.kernels.triton import configs
from faverify.kernels.triton.configs import Tile
from faverify.kernels.triton.launch import Launch
from faverify.kernels.triton.variant import interface as vinterface
from faverify.subjects import resolve

# keys a step must divide the split block (variant.interface.SPLIT_BLOCK: a split boundary is a tile's)
KEYS = (16, 32, 64)
WARPS = (2, 4, 8)
STAGES = (1, 2, 3)


def candidates() -> list:
    return [Tile(configs.DECODE_TILE, n, w, s) for n, w, s in itertools.product(KEYS, WARPS, STAGES)
            if vinterface.SPLIT_BLOCK % n == 0]


def run(cfg, x, splits: int, tile, device):
    """(ms, out, paths) of triton-paged on the configuration's inputs x, cut into `splits`, with `tile` for the
    decode kernel (None: the default)."""
    paged = resolve("triton-paged")
    launch = Launch(decode_tile=tile)
    subject = dataclasses.replace(paged, fn=lambda *args, **kwargs: paged.fn(*args, launch=launch, **kwargs))
    case = dataclasses.replace(cfg.case(paged=True), splits=splits)
    with torch.no_grad():
        out = subject(x.q, x.k, x.v, case, x.extras())[0].float()
    ms, _ = time_forward(subject, x, case, device)
    return ms, out, sorted(set(subject.take().paths))


def decode_options(doc: str, pages: str) -> argparse.ArgumentParser:
    """The options of the decode devtools: head dims, dtype, page sizes and cache lengths (bench --decode's)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--headdims", default="128")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--pages", default=pages)
    p.add_argument("--caches", default=",".join(map(str, bench_decode.CACHE_LENS)))
    return p


def main() -> None:
    p = decode_options(__doc__, "16,64")
    p.add_argument("--splits", default="1,2,4,8,16,32")
    p.add_argument("--tokens", type=int, default=bench_decode.DECODE_TOKENS)
    p.add_argument("--no-tiles", action="store_true", help="time the split counts only")
    p.add_argument("--json")
    a = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    peak = bench_decode.copy_bandwidth(device) if device.type == "cuda" else 1e12
    print(f"device copy bandwidth {peak / 1e12:.2f} TB/s; default tile: configs.decode")
    rows = []
    for d, n, page in itertools.product(map(int, a.headdims.split(",")), map(int, a.caches.split(",")),
                                        map(int, a.pages.split(","))):
        cfg = bench_decode.DecodeConfig(a.dtype, d, n, page, tokens=a.tokens)
        rule = bench_decode._splits(resolve("triton-paged"), cfg.case(paged=True), device)
        x = make_inputs(cfg.case(paged=True, splits=rule), device)
        elem = x.q.element_size()
        base_ms, base_out, _ = run(cfg, x, rule, None, device)

        def record(splits, tile):
            ms, out, paths = run(cfg, x, splits, tile, device)
            tbps = cfg.cache_bytes(elem) / (ms * 1e-3)
            row = dict(head_dim=d, cache=n, batch=cfg.batch, page=page, splits=splits, rule_splits=rule,
                       tile=str(tile or "default"), ms=ms, tbps=tbps / 1e12, of_copy=tbps / peak,
                       vs_default=base_ms / ms, max_abs_diff=float((out - base_out).abs().max()), paths=paths)
            rows.append(row)
            print(f"d{d} cache {n} b{cfg.batch} page {page} splits {splits:3d} {row['tile']:>32}  {ms:8.3f} ms  "
                  f"{row['tbps']:.2f} TB/s ({row['of_copy']:.2f})  x{row['vs_default']:.2f}  "
                  f"diff {row['max_abs_diff']:.2e}  {','.join(paths)}", flush=True)
            return row
        # first the split count with the default tile, then every tile at the best count (MAX_SPLITS bounds both)
        counts = sorted({max(1, min(MAX_SPLITS, round(rule * float(m)))) for m in a.splits.split(",")} | {MAX_SPLITS})
        best = min((record(s, None) for s in counts), key=lambda r: r["ms"])["splits"]
        for tile in [] if a.no_tiles else candidates():
            record(best, tile)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
