"""The `triton` subject: the bundled Triton kernels under test."""
from __future__ import annotations

import os
import sys

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
        return flash_attn_func(q, k, v, causal=causal, softmax_scale=softmax_scale, init=init, return_lse=True)

    caps = Capabilities(devices=("cpu",) if INTERPRET else ("cuda",), init_modes=("-inf", "-1e30"), lse=True)
    mode = "under the Triton interpreter (CPU)" if INTERPRET else "compiled for the GPU"
    interface = sys.modules[flash_attn_func.__module__]  # a mutant's own copy for a mutant
    return Subject(name=name, fn=fn, caps=caps, description=f"{description}, {mode}",
                   warmup=None if INTERPRET else warmup_cases, paths=interface.take_paths)


def warmup_cases(dtypes: tuple) -> list:
    """One small case per compiled variant a fuzz of these dtypes can meet (Subject.warmup).

    A launch compiles per dtype, padded head dim (BLOCK_DS), causal, EVEN_D (head dim == its padding),
    and fast or generic build (interface._build: fast when every stride is a multiple of 16 and every
    pointer 16-byte aligned). Contiguous inputs take the fast build when the head dim is a multiple of
    16 (the padding itself, or e.g. 96 in 128), the generic one otherwise (e.g. 127); the "strided"
    layout (row pitch head_dim + 8) always takes the generic one. The tiles are the defaults, which do
    not depend on the shape, so one shape serves. Ordered so that concurrent workers start on different
    variants."""
    from faverify.case import Case
    from faverify.kernels.triton.common import BLOCK_DS

    def head_dims(bd: int, layout: str) -> tuple:
        if layout == "strided":
            return (bd,)
        return (bd, bd - 1) + ((bd - 16,) if bd >= 64 else ())  # bd - 16: a multiple of 16 below bd

    variants = [(layout, head_dim) for layout in ("contiguous", "strided")
                for bd in BLOCK_DS for head_dim in head_dims(bd, layout)]
    return [Case(batch=1, seqlen_q=97, seqlen_k=97, nheads=2, nheads_k=1, head_dim=head_dim, dtype=dtype,
                 causal=causal, layout=layout)
            for layout, head_dim in variants for dtype in dtypes for causal in (False, True)]


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
