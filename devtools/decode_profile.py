"""The GPU time of each kernel of a decode step of triton-paged, on `faverify bench --decode`'s
configurations (GQA 8, batch x cache = 131072 tokens, pages in a random order, the split rule's count):
torch.profiler over replays of a CUDA graph of one call (bench.graphed), as bench --decode times it. GPU only.

    python3 devtools/decode_profile.py [--headdims 128] [--dtype bf16] [--pages 16]
                                       [--caches 4096,16384,65536,131072] [--replays 20]

One line per configuration: each kernel's mean time a step, and how many times it ran.
"""
import dataclasses

import torch
from decode_sweep import decode_options  # devtools/, the script's own folder
from torch.profiler import ProfilerActivity, profile

from faverify.cases.inputs import make_inputs
from faverify.commands import bench_decode
from faverify.commands.bench import graphed
from faverify.subjects import resolve


def main() -> None:
    p = decode_options(__doc__, "16")
    p.add_argument("--replays", type=int, default=20)
    a = p.parse_args()
    subject = resolve("triton-paged")
    for cfg in bench_decode.configs((a.dtype,), tuple(map(int, a.headdims.split(","))),
                                    tuple(map(int, a.caches.split(","))), tuple(map(int, a.pages.split(",")))):
        case = cfg.case(paged=True)
        case = dataclasses.replace(case, splits=bench_decode._splits(subject, case, "cuda"))
        x = make_inputs(case, "cuda")
        with torch.no_grad():
            step, how = graphed(lambda: subject(x.q, x.k, x.v, case, x.extras()), "cuda")
            step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(a.replays):
                    step()
                torch.cuda.synchronize()
        kernels = [(e.key, e.device_time_total / a.replays, e.count // a.replays) for e in prof.key_averages()
                   if e.device_time_total > 0]
        print(f"d{cfg.head_dim} cache {cfg.cache_len} b{cfg.batch} page {cfg.page_size} splits {case.splits} "
              f"({how}): " + "; ".join(f"{name[:48]} {us:.1f} us x{n}" for name, us, n in kernels), flush=True)


if __name__ == "__main__":
    main()
