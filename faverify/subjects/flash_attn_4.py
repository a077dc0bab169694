"""flash-attn 4 (FlashAttention's CuTe-DSL kernels, the `flash_attn.cute` package of the flash-attn-4 wheel)
as a subject: present where the package imports (a Hopper or Blackwell GPU), an EnvironmentProblem naming
the import error elsewhere (`faverify kernels` lists it as unavailable, with that reason).

Its vocabulary is flash-attn's but for a few words, translated here: a window side with no bound is None
(translate.flash_attn_4_window), the sinks are `learnable_sink` (a logit per head in the scaled logits'
units, as faverify's), a varlen batch is cu_seqlens with max_seqlen, and a paged cache is `page_table`
with `seqused_k` through flash_attn_varlen_func, q staying [batch, seqlen_q, heads, d]. lse comes back
as faverify's ([b, h, sq]; varlen [h, total]), natural log (conventions "flash-attn-4"). No ALiBi (the
library has none), 16-bit only, head dims multiples of 8 up to 256 (its _validate_head_dims on sm_90: a
fuzz draws its head dims so). Two of its own assertions make a case Unsupported, skipped with the reason:
its sm_90 backward takes GQA only with q/k's and v's head dims equal (flash_bwd_sm90.py), so such a case
that will be differentiated (q requires grad); its paged path without TMA (pages other than its key tile)
takes head dims that are multiples of 16 alone ("Paged KV does not support irregular head dim").
"""
from __future__ import annotations

import os

from faverify.errors import EnvironmentProblem, Unsupported
from faverify.subjects.base import Capabilities, Subject
from faverify.subjects.translate import flash_attn_4_window

ALIGNMENT = 8  # head dims the library takes: multiples of 16 bytes of a 16-bit element
PAGED_ALIGNMENT = 16  # head dims its paged path takes: its tiles' head dim is padded to 16, and unpadded there


def _library():
    # its on-disk compile cache, off unless asked for: on, a configuration one worker compiled (2-4 s each)
    # loads in every other worker and in the next run; a user's own setting stands
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    try:
        from flash_attn import cute
    except Exception as e:  # ImportError, or the CuTe DSL failing to find CUDA
        raise EnvironmentProblem(f"flash-attn-4: flash_attn.cute does not import here ({type(e).__name__}: "
                                 f"{e}); it is the flash-attn-4 wheel, for Hopper and Blackwell GPUs") from e
    return cute


def flash_attn_4(q, k, v, *, causal: bool, softmax_scale=None, window_size=(-1, -1), softcap: float = 0.0,
                 sinks=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                 block_table=None, cache_seqlens=None):
    """faverify's keywords (flash-attn's) -> flash_attn.cute's call; (out, lse)."""
    d, dv = q.shape[-1], v.shape[-1]
    if q.requires_grad and dv != d and q.shape[-2] != k.shape[-2]:
        raise Unsupported(f"flash-attn-4: its backward takes GQA only with head_dim == head_dim_v (q/k {d}, v {dv}, "
                          f"{q.shape[-2]} query heads on {k.shape[-2]})")
    if block_table is not None and (d % PAGED_ALIGNMENT or dv % PAGED_ALIGNMENT):
        raise Unsupported(f"flash-attn-4: a paged cache takes head dims that are multiples of {PAGED_ALIGNMENT} "
                          f"(q/k {d}, v {dv})")
    cute = _library()
    common = dict(softmax_scale=softmax_scale, causal=causal, window_size=flash_attn_4_window(tuple(window_size)),
                  learnable_sink=sinks, softcap=float(softcap or 0.0), return_lse=True)
    if cu_seqlens_q is not None:
        return cute.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                           max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, **common)
    if block_table is not None:  # q [b, sq, h, d] against the pools, sequence b's keys through its row
        return cute.flash_attn_varlen_func(q, k, v, seqused_k=cache_seqlens, page_table=block_table, **common)
    return cute.flash_attn_func(q, k, v, **common)


def _version(cute) -> str:
    """The wheel's version (flash_attn.cute's __version__ reads another distribution's and says 0.0.0)."""
    from importlib import metadata
    try:
        return metadata.version("flash-attn-4")
    except metadata.PackageNotFoundError:
        return getattr(cute, "__version__", "?")


def make() -> Subject:
    cute = _library()
    caps = Capabilities.of(dtypes=("bf16", "fp16"), devices=("cuda",), min_head_dim=ALIGNMENT, max_head_dim=256,
                           head_dim_multiple=ALIGNMENT, lse=True,
                           window=True, softcap=True, sinks=True, head_dim_v=True, varlen=True, paged=True,
                           conventions="flash-attn-4")
    return Subject(name="flash-attn-4", fn=flash_attn_4, caps=caps,
                   description=f"flash-attn 4 ({_version(cute)}), CuTe-DSL kernels", standalone=STANDALONE)


# what `repro --standalone` writes for a dense case: the library's own call, as its users make it
STANDALONE = '''from flash_attn.cute import flash_attn_func


def call(q, k, v, causal, softmax_scale):
    """flash-attn 4's dense call on [b, s, h, d]: (out, lse)."""
    return flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal, return_lse=True)'''
