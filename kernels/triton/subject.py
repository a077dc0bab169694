"""The `triton` subject: the bundled Triton kernels under test."""
from __future__ import annotations

import os

import torch

from faverify.subjects.base import Capabilities, Subject


def make() -> Subject:
    # Without a GPU the kernels run under the Triton interpreter, which must be chosen before the
    # kernels are defined (triton.jit reads it at decoration time).
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from faverify.kernels.triton import flash_attn_func
    from faverify.kernels.triton.common import INTERPRET

    def fn(q, k, v, *, causal, softmax_scale, init):
        return flash_attn_func(q, k, v, causal=causal, softmax_scale=softmax_scale, init=init, return_lse=True)

    caps = Capabilities(devices=("cpu",) if INTERPRET else ("cuda",), init_modes=("-inf", "-1e30"), lse=True)
    mode = "under the Triton interpreter (CPU)" if INTERPRET else "compiled for the GPU"
    return Subject(name="triton", fn=fn, caps=caps, description=f"bundled FlashAttention-2 in Triton, {mode}")
