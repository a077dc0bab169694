"""Input validation for every bundled kernel, in one place. Each message names the rule it enforces.

Conventions (docs/design.md): q [batch, seqlen_q, nheads, head_dim], k and v [batch, seqlen_k, nheads_k,
head_dim] with nheads_k dividing nheads; the last dimension contiguous; dtype fp16, bf16 or fp32.
"""
from __future__ import annotations

import math

import torch

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INITS = ("-inf", "-1e30")


def check_inputs(q, k, v, *, causal, softmax_scale, init, max_head_dim: int = 256, min_head_dim: int = 1,
                 dtypes: tuple = DTYPES, allow_cpu: bool = False, device_hint: str = "CUDA tensors") -> float:
    """Raise ValueError naming the rule a bad input breaks; return the softmax scale to use."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions [batch, seqlen, nheads, head_dim], got shape "
                             f"{tuple(t.shape)}")
        if t.dtype not in dtypes:
            raise ValueError(f"{name} has dtype {t.dtype}; supported: {', '.join(str(d) for d in dtypes)}")
        if t.device.type != "cuda" and not (allow_cpu and t.device.type == "cpu"):
            raise ValueError(f"{name} is on {t.device}; these kernels take {device_hint}")
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension (stride {t.stride(-1)})")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must have the same dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on the same device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must have the same batch size, got {q.shape[0]} and {k.shape[0]}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must have the same head_dim, got {q.shape[3]} and {k.shape[3]}")
    if k.shape[2] == 0 or q.shape[2] % k.shape[2]:
        raise ValueError(f"Number of heads in key/value ({k.shape[2]}) must divide number of heads in query "
                         f"({q.shape[2]})")
    d = q.shape[3]
    if not min_head_dim <= d <= max_head_dim:
        raise ValueError(f"head_dim must be in {min_head_dim}..{max_head_dim}, got {d}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got {causal!r}")
    if init not in INITS:
        raise ValueError(f"init must be one of {', '.join(INITS)}, got {init!r}")
    if softmax_scale is None:
        return d ** -0.5
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) \
            or not math.isfinite(softmax_scale) or softmax_scale <= 0:
        raise ValueError(f"softmax_scale must be a finite number > 0 or None, got {softmax_scale!r}")
    return float(softmax_scale)
