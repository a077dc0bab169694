"""Launchers, autograd and the public flash_attn_func of the CUDA kernels (variants "mma" and "simt")."""
from __future__ import annotations

import ctypes
import functools

import torch

from faverify.kernels.autograd import row_stats_function
from faverify.kernels.constants import LOG2E
from faverify.kernels.cuda import build
from faverify.kernels.validate import check_inputs

DTYPE_CODE = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}
VARIANTS = {  # name: (forward launcher, backward launcher, dtypes)
    "mma": ("fa_mma_fwd", "fa_mma_bwd", (torch.float16, torch.bfloat16)),
    "simt": ("fa_simt_fwd", "fa_simt_bwd", (torch.float16, torch.bfloat16, torch.float32)),
}
MAX_GRID_Y = 65535  # batch * heads is the grid's y dimension


class Params(ctypes.Structure):
    """Mirror of fa::Params in common.cuh: same fields, same order."""
    _fields_ = ([(n, ctypes.c_void_p) for n in ("q", "k", "v", "out", "lse", "rowmax", "log2l", "dout", "delta",
                                                 "dq", "dk", "dv")]
                + [(f"{t}_{d}", ctypes.c_int64) for t in ("q", "k", "v", "o", "do", "dq", "dk", "dv")
                   for d in ("b", "s", "h")]
                + [(n, ctypes.c_int) for n in ("b", "h", "hk", "sq", "sk", "d")]
                + [("scale", ctypes.c_float), ("scale_log2", ctypes.c_float), ("causal", ctypes.c_int),
                   ("aligned", ctypes.c_int)])


def _library(device: torch.device):
    return _checked_library(torch.cuda.get_device_capability(device))


@functools.lru_cache(maxsize=None)
def _checked_library(capability: tuple):
    """The library for this architecture, its parameter block checked once against the ctypes mirror
    (not on every launch)."""
    lib = build.load(capability)
    if lib.fa_params_size() != ctypes.sizeof(Params):  # the ctypes mirror and common.cuh disagree
        raise build.BuildError(f"fa::Params is {lib.fa_params_size()} bytes in the library but "
                               f"{ctypes.sizeof(Params)} in interface.Params: keep the two in step")
    return lib


def _check(lib, code: int, what: str) -> None:
    if code:
        raise RuntimeError(f"{what}: {lib.fa_error_string(code).decode()} (CUDA error {code})")


def _aligned(tensors, d: int) -> bool:
    """cp.async moves 16 bytes: every row start must be 16-byte aligned and d a multiple of 8 elements."""
    return d % 8 == 0 and all(t.data_ptr() % 16 == 0 and all(s % 8 == 0 for s in t.stride()[:-1])
                              for t in tensors)


def _params(q, k, v, scale: float, causal: bool, **tensors) -> Params:
    b, sq, h, d = q.shape
    p = Params(b=b, h=h, hk=k.shape[2], sq=sq, sk=k.shape[1], d=d, scale=scale, scale_log2=scale * LOG2E,
               causal=int(causal))
    named = dict(q=q, k=k, v=v, **tensors)
    for name, t in named.items():
        setattr(p, name, t.data_ptr())
        prefix = {"out": "o", "dout": "do"}.get(name, name)
        if t.dim() == 4 and hasattr(p, f"{prefix}_b"):
            setattr(p, f"{prefix}_b", t.stride(0))
            setattr(p, f"{prefix}_s", t.stride(1))
            setattr(p, f"{prefix}_h", t.stride(2))
    p.aligned = int(_aligned([t for t in named.values() if t.dim() == 4], d))
    return p


def forward(q, k, v, scale: float, causal: bool, init: str, variant: str):
    b, sq, h, d = q.shape
    out = torch.empty((b, sq, h, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
    rowmax, log2l = torch.empty_like(lse), torch.empty_like(lse)
    if sq == 0:
        return out, lse, (rowmax, log2l)
    if k.shape[1] == 0:  # no key at all: every row follows the convention for rows that see none
        return out.zero_(), lse.fill_(float("-inf")), (rowmax.zero_(), log2l.fill_(float("inf")))
    lib = _library(q.device)
    p = _params(q, k, v, scale, causal, out=out, lse=lse, rowmax=rowmax, log2l=log2l)
    with torch.cuda.device(q.device):
        stream = torch.cuda.current_stream(q.device).cuda_stream
        _check(lib, getattr(lib, VARIANTS[variant][0])(ctypes.byref(p), DTYPE_CODE[q.dtype], int(init == "-inf"),
                                                        stream), f"cuda {variant} forward")
    return out, lse, (rowmax, log2l)


def backward(dout, q, k, v, out, rows: tuple, scale: float, causal: bool, variant: str):
    rowmax, log2l = rows
    dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    if q.shape[1] == 0 or k.shape[1] == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    if dout.stride(-1) != 1:  # autograd may hand us an expanded gradient (stride 0): one copy of dO only
        dout = dout.contiguous()
    delta = torch.empty_like(rowmax)
    lib = _library(q.device)
    p = _params(q, k, v, scale, causal, out=out, dout=dout, dq=dq, dk=dk, dv=dv, rowmax=rowmax, log2l=log2l,
                delta=delta)
    code = DTYPE_CODE[q.dtype]
    with torch.cuda.device(q.device):
        stream = torch.cuda.current_stream(q.device).cuda_stream
        _check(lib, lib.fa_delta(ctypes.byref(p), code, stream), "cuda backward preprocessing")
        _check(lib, getattr(lib, VARIANTS[variant][1])(ctypes.byref(p), code, stream), f"cuda {variant} backward")
    return dq, dk, dv


_Function = row_stats_function("CudaFlashAttnFunction", forward, backward)


def flash_attn_func(q, k, v, causal: bool = False, softmax_scale: float | None = None, init: str = "-inf",
                    return_lse: bool = False, variant: str = "mma"):
    """FlashAttention forward (and backward through autograd) in CUDA C++.

    q: [batch, seqlen_q, nheads, head_dim]; k, v: [batch, seqlen_k, nheads_k, head_dim], nheads_k dividing
    nheads (GQA/MQA); CUDA tensors, fp16 or bf16 (variant "simt" also fp32); head_dim 1..256 (padded inside
    to 32, 64, 128 or 256); any strides with a contiguous last dimension.
    causal: bottom-right aligned (query i sees key j iff j <= i + seqlen_k - seqlen_q).
    softmax_scale: defaults to head_dim ** -0.5.
    init: start of the running max, "-inf" (guarded) or "-1e30" (guarded at l == 0); same result either way.
    variant: "mma" (tensor cores, mma.sync) or "simt" (CUDA cores, the readable reference version).
    Returns out [batch, seqlen_q, nheads, head_dim] in the input dtype, and with return_lse also
    lse [batch, nheads, seqlen_q] float32 (natural log; -inf for a row that sees no key).
    The library is built by nvcc on first use and cached (build.py).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    scale = check_inputs(q, k, v, causal=causal, softmax_scale=softmax_scale, init=init,
                         dtypes=VARIANTS[variant][2])
    if q.shape[0] * q.shape[2] > MAX_GRID_Y:
        raise ValueError(f"batch * nheads must be at most {MAX_GRID_Y} (the launch grid's y dimension), got "
                         f"{q.shape[0] * q.shape[2]}")
    out, lse = _Function.apply(q, k, v, causal, scale, init, variant)[:2]
    return (out, lse) if return_lse else out


def flash_attn_func_simt(q, k, v, causal: bool = False, softmax_scale: float | None = None, init: str = "-inf",
                         return_lse: bool = False):
    """flash_attn_func with the CUDA-core kernels (fp32 too)."""
    return flash_attn_func(q, k, v, causal, softmax_scale, init, return_lse, variant="simt")
