"""flash-attn 2 and 3 (FlashAttention's CUDA kernels) as subjects: `flash-attn` is the flash_attn package's
flash_attn_func, flash_attn_varlen_func and flash_attn_with_kvcache (flash-attn 2, sm_80 and later);
`flash-attn-3` the same three of its Hopper build, the flash_attn_interface module. Each is present where
its module imports, an EnvironmentProblem naming the import error elsewhere (`faverify kernels` lists it as
unavailable, with that reason).

faverify's keywords are flash-attn's own (docs/design.md), so the translation is small:
- dense and varlen cases take flash_attn_func and flash_attn_varlen_func, forward and backward; lse comes
  back when return_attn_probs is asked for ([b, h, sq]; varlen [h, total]), natural log;
- a paged case takes flash_attn_with_kvcache with the block table (flash-attn 2's `block_table`, whose
  pages must hold a multiple of 256 keys; flash-attn 3's `page_table`, any page size), forward only;
- ALiBi (flash-attn 2 only) as alibi_slopes [h] or [b, h] in fp32, the relative form of the flash
  convention; no sinks; q/k's and v's head dims alike.
The conventions presets "flash-attn-2" (lse +inf on a row that sees no key) and "flash-attn-3" say how
the verdict reads them.
"""
from __future__ import annotations

import functools

from faverify.errors import EnvironmentProblem, Unsupported
from faverify.subjects.base import Capabilities, Subject, drain

FA2_PAGE = 256  # flash-attn 2's paged KV: a page holds a multiple of this many keys
LAUNCHED: list = []  # the function each call took, in order (Subject.paths)


def _library(name: str):
    """flash-attn 2's flash_attn package, or flash-attn 3's flash_attn_interface module."""
    try:
        if name == "flash-attn":
            import flash_attn
            flash_attn.flash_attn_func  # the CUDA extension's functions, absent from a flash_attn.cute-only install
            return flash_attn
        import flash_attn_interface
        return flash_attn_interface
    except Exception as e:  # ImportError, AttributeError, or the extension failing to load
        package = "flash-attn (2.x, its CUDA extension)" if name == "flash-attn" else \
            "flash-attn 3 (its hopper/ build, module flash_attn_interface)"
        raise EnvironmentProblem(f"{name}: {package} does not import here ({type(e).__name__}: {e})") from e


def _out_lse(result):
    """out and lse of a call made with return_attn_probs / return_softmax_lse: (out, lse[, ...])."""
    if isinstance(result, (tuple, list)):
        return result[0], result[1]
    raise TypeError(f"expected (out, lse, ...) from the library, got {type(result).__name__}")


def _with_lse(f, *args, **kwargs):
    """f(..., return_attn_probs=True): (out, lse, ...). flash-attn 3 builds before that keyword return
    (out, lse) without it."""
    try:
        return _out_lse(f(*args, return_attn_probs=True, **kwargs))
    except TypeError as e:
        if "return_attn_probs" not in str(e):
            raise
        return _out_lse(f(*args, **kwargs))


def flash_attn_call(lib, version: int):
    """faverify's keywords -> the flash-attn function for the case's kind; (out, lse)."""
    def fn(q, k, v, *, causal: bool, softmax_scale=None, window_size=(-1, -1), softcap: float = 0.0,
           alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
           block_table=None, cache_seqlens=None):
        if q.shape[-1] != v.shape[-1]:
            raise Unsupported(f"flash-attn {version}: v's head dim ({v.shape[-1]}) must be q's ({q.shape[-1]})")
        if version == 3 and q.shape[-1] % 8:
            raise Unsupported(f"flash-attn 3: head dims must be multiples of 8 (got {q.shape[-1]})")
        common = dict(softmax_scale=softmax_scale, causal=causal, window_size=tuple(window_size),
                      softcap=float(softcap or 0.0))
        if alibi_slopes is not None:
            common["alibi_slopes"] = alibi_slopes
        if block_table is not None:
            LAUNCHED.append("with_kvcache paged")
            table = {"block_table": block_table} if version == 2 else {"page_table": block_table}
            return _out_lse(lib.flash_attn_with_kvcache(q, k, v, cache_seqlens=cache_seqlens, **table,
                                                        return_softmax_lse=True, **common))
        if cu_seqlens_q is not None:
            LAUNCHED.append("varlen")
            return _with_lse(lib.flash_attn_varlen_func, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                             max_seqlen_k, **common)
        LAUNCHED.append("func")
        return _with_lse(lib.flash_attn_func, q, k, v, **common)
    return fn


def make(name: str) -> Subject:
    lib = _library(name)
    version = 2 if name == "flash-attn" else 3
    caps = Capabilities.of(dtypes=("bf16", "fp16"), devices=("cuda",), min_head_dim=8 if version == 3 else 1,
                           max_head_dim=256, lse=True, window=True, softcap=True, alibi=version == 2, varlen=True,
                           paged=True, page_sizes=(FA2_PAGE,) if version == 2 else None,
                           conventions=f"flash-attn-{version}")
    return Subject(name=name, fn=flash_attn_call(lib, version), caps=caps, paths=functools.partial(drain, LAUNCHED),
                   description=f"flash-attn {getattr(lib, '__version__', version)}: flash_attn_func, varlen and "
                               "with_kvcache (paged, forward only)")
