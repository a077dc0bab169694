"""The `cuda` and `cuda-simt` subjects: the bundled CUDA kernels under test."""
from __future__ import annotations

import torch

from faverify.subjects.base import Capabilities, Subject

DESCRIPTIONS = {
    "cuda": ("mma", ("fp16", "bf16"), "bundled FlashAttention-2 in CUDA C++, tensor cores (mma.sync m16n8k16)"),
    "cuda-simt": ("simt", ("fp16", "bf16", "fp32"), "bundled FlashAttention-2 in CUDA C++, CUDA cores"),
}


def make(name: str) -> Subject:
    """Builds (or loads from the cache) the library now when there is a GPU, so that a missing nvcc or a
    failed build stops the run with exit 2 before any case runs. Without a GPU every case is skipped."""
    variant, dtypes, description = DESCRIPTIONS[name]
    from faverify.kernels.cuda import build
    from faverify.kernels.cuda.interface import flash_attn_func
    if torch.cuda.is_available():
        build.load(torch.cuda.get_device_capability())

    def fn(q, k, v, *, causal, softmax_scale, init):
        return flash_attn_func(q, k, v, causal=causal, softmax_scale=softmax_scale, init=init, return_lse=True,
                               variant=variant)

    caps = Capabilities.of(dtypes=dtypes, devices=("cuda",), init_modes=("-inf", "-1e30"), lse=True)
    return Subject(name=name, fn=fn, caps=caps, description=description)
