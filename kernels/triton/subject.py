"""The `triton` subject: the bundled Triton kernels under test."""
from __future__ import annotations

import os
import warnings

import torch

from faverify.subjects.base import Capabilities, Subject


def _choose_interpreter() -> None:
    # Without a GPU the kernels run under the Triton interpreter, which must be chosen before the
    # kernels are defined (triton.jit reads it at decoration time).
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def _wrap(name: str, flash_attn_func, description: str) -> Subject:
    from faverify.kernels.triton.common import INTERPRET

    def fn(q, k, v, *, causal, softmax_scale, init):
        if not INTERPRET:
            return flash_attn_func(q, k, v, causal=causal, softmax_scale=softmax_scale, init=init, return_lse=True)
        # The interpreter evaluates masked logits (-inf) and huge values in NumPy, which warns on every
        # overflow to inf that the kernel then masks or clamps as the GPU does: noise, not news.
        import numpy as np
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return flash_attn_func(q, k, v, causal=causal, softmax_scale=softmax_scale, init=init, return_lse=True)

    caps = Capabilities(devices=("cpu",) if INTERPRET else ("cuda",), init_modes=("-inf", "-1e30"), lse=True)
    mode = "under the Triton interpreter (CPU)" if INTERPRET else "compiled for the GPU"
    return Subject(name=name, fn=fn, caps=caps, description=f"{description}, {mode}")


def make() -> Subject:
    _choose_interpreter()
    from faverify.kernels.triton import flash_attn_func
    return _wrap("triton", flash_attn_func, "bundled FlashAttention-2 in Triton")


def make_mutant(name: str) -> Subject:
    """`mutant:NAME`: the Triton kernels with one seeded bug (kernels/mutants/catalog.py)."""
    _choose_interpreter()
    from faverify.kernels.mutants.build import load
    from faverify.kernels.mutants.catalog import BY_NAME
    return _wrap(f"mutant:{name}", load(name), f"mutant: {BY_NAME[name].bug}")
