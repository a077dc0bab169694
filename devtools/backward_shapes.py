"""The shapes the backward scripts (backward_profile.py, hopper_bwd_ab.py) run: `faverify bench`'s (batch x
seqlen = 16384 tokens, heads x head dim = 2048) at the head dims and seqlens asked for, causal and not, with
random q, k, v and dO on the GPU."""
import torch

from faverify.commands.bench import Config


def add_arguments(parser) -> None:
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--headdims", default="64,128")
    parser.add_argument("--seqlens", default="4096,16384")


def inputs(args):
    """(config, q, k, v, dO) for each shape, [batch, seqlen, heads, head dim] in args.dtype."""
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    for d in map(int, args.headdims.split(",")):
        for n in map(int, args.seqlens.split(",")):
            for causal in (True, False):
                cfg = Config(args.dtype, d, causal, n)
                yield (cfg, *(torch.randn(cfg.batch, n, cfg.nheads, d, device="cuda", dtype=dt) for _ in range(4)))
