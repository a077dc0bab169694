"""torch's scaled_dot_product_attention backends as subjects.

torch's `is_causal=True` is top-left aligned when seqlen_q != seqlen_k, so causal cases with unequal
lengths pass `causal_lower_right` to follow the bottom-right convention (docs/torch-backends.md).
A backend that cannot run a case skips it with torch's reason: torch raises "No available kernel" (CUDA) or
"No viable backend" (other devices, newer torch) and says why in warnings, which are kept for the skip.
"""
from __future__ import annotations

import re
import warnings

import torch
import torch.nn.functional as F

from faverify.cases.mods import sech2
from faverify.errors import Unsupported
from faverify.subjects.base import Capabilities, Subject

_BACKENDS = {
    # the math backend is differentiable in a float mask: windows, ALiBi, softcap and sinks go through one
    "sdpa-math": ("MATH", "torch SDPA math backend (reference-style, materializes the score matrix; variants "
                          "through an fp32 float mask)",
                  Capabilities.of(max_head_dim=576, window=True, softcap=True, alibi=True, sinks=True,
                                  head_dim_v=True, varlen=True, paged=True, mask=True, bias=True, bias_grad=True,
                                  fp8=("tensor", "head", "block"), fp8_formats=("e4m3", "e5m2"), sparse=True,
                                  kv_shared=True)),
    "sdpa-flash": ("FLASH_ATTENTION", "torch SDPA FlashAttention-2 backend",
                   Capabilities.of(dtypes=("bf16", "fp16"), devices=("cuda",))),
    "sdpa-efficient": ("EFFICIENT_ATTENTION", "torch SDPA memory-efficient (xformers) backend",
                       Capabilities.of(devices=("cuda",), mask=True, bias=True, bias_grad=True)),
    "sdpa-cudnn": ("CUDNN_ATTENTION", "torch SDPA cuDNN backend",
                   Capabilities.of(dtypes=("bf16", "fp16"), devices=("cuda",), mask=True, bias=True)),
}


_NO_KERNEL = ("No available kernel", "No viable backend")
# Not reasons: headers, the warning on every sq > sk, and the other backends that sdpa_kernel switched off.
_NOT_A_REASON = ("not used because", "Lower right causal bias", "has been runtime disabled")
_WHERE = re.compile(r"\s*\(Triggered internally at [^)]*\)")  # torch's source location
_SIZES = re.compile(r"\[[\d, ]*\]")  # a shape, as in "Query.sizes(): [1, 8, 1, 16]"


def _why(seen) -> str:
    """torch's reasons for refusing a case, from the warnings it gave, without their shape details and
    source locations (one skip row per reason, not per shape)."""
    reasons = []
    for w in seen:
        text = _SIZES.sub("[...]", _WHERE.sub("", " ".join(str(w.message).split())))
        for part in text.split("; "):  # one warning may carry several backends' reasons
            if part and not any(m in part for m in _NOT_A_REASON):
                reasons.append(part.split(" Got ")[0].split(". Got")[0].rstrip(". "))
    return "; ".join(dict.fromkeys(reasons))[:300]


def names() -> tuple:
    return tuple(_BACKENDS)


def make(name: str) -> Subject:
    backend_name, description, caps = _BACKENDS[name]

    def fn(q, k, v, *, causal: bool, softmax_scale: float, window_size=None, softcap=None, alibi_slopes=None,
           sinks=None, attn_mask=None, q_descale=None, k_descale=None, v_descale=None, indices=None):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right

        if q_descale is not None:  # FP8 (sdpa-math only): the values they stand for, in fp32; out in bf16
            from faverify.cases.fp8 import dequantized
            q, k, v = (dequantized(t, d).float() for t, d in zip((q, k, v), (q_descale, k_descale, v_descale)))
            return fn(q, k, v, causal=causal, softmax_scale=softmax_scale).to(torch.bfloat16)

        sq, sk = q.shape[1], k.shape[1]
        if indices is not None:  # the keys they list as an additive mask, each duplicate's weight in it
            from faverify.cases.sparse import visibility
            keep, weight = visibility(indices, sk, q.shape[2], caps.conventions.sparse_duplicates)
            attn_mask = torch.zeros(keep.shape, device=q.device) if weight is None else weight
            attn_mask = attn_mask.masked_fill(~keep, float("-inf")).to(q.dtype)
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        variant = window_size is not None or softcap or alibi_slopes is not None or sinks is not None
        try:
            with sdpa_kernel(getattr(SDPBackend, backend_name)), warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")  # recorded, not shown: torch's reasons when it refuses a case
                if variant:  # in fp32: a sink of 1e9 or a softcap's correction does not fit a 16-bit mask
                    qt, kt, vt, mask = _variant_mask(qt.float(), kt.float(), vt.float(), causal, softmax_scale,
                                                     window_size, softcap, alibi_slopes, sinks, attn_mask)
                    is_causal = False
                elif attn_mask is not None:  # SDPA takes a mask or is_causal: causal goes into the mask
                    _refuses_bias_dtype(name, attn_mask, q)
                    mask, is_causal = _with_causal(attn_mask, sq, sk) if causal else attn_mask, False
                else:
                    is_causal = causal and sq == sk  # top-left and bottom-right agree when sq == sk
                    mask = causal_lower_right(sq, sk) if causal and sq != sk else None
                out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=is_causal,
                                                     scale=softmax_scale, enable_gqa=kt.shape[1] != qt.shape[1])
        except RuntimeError as e:
            if any(m in str(e) for m in _NO_KERNEL):
                why = _why(seen)
                raise Unsupported(f"{name}: no available kernel for this case" + (f": {why}" if why else "")) from None
            raise
        return out.transpose(1, 2).to(q.dtype)

    if caps.ragged.varlen or caps.ragged.paged:  # one sequence at a time (a reference path: per_sequence.py)
        from faverify.subjects.per_sequence import ragged
        fn = ragged(fn)
    return Subject(name=name, fn=fn, caps=caps, description=description,
                   standalone=STANDALONE.format(backend=backend_name))


# what `repro --standalone` writes for a dense case: the call above without faverify's variant paths
STANDALONE = '''import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right


def call(q, k, v, causal, softmax_scale):
    """SDPA takes [b, h, s, d]; causal bottom-right where sq != sk (is_causal is top-left)."""
    sq, sk = q.shape[1], k.shape[1]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    mask = causal_lower_right(sq, sk) if causal and sq != sk else None
    with sdpa_kernel(SDPBackend.{backend}):
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=causal and sq == sk,
                                             scale=softmax_scale, enable_gqa=kt.shape[1] != qt.shape[1])
    return out.transpose(1, 2)'''


def _refuses_bias_dtype(name: str, attn_mask, q) -> None:
    """The memory-efficient backend refuses a float mask of another dtype than q's ("invalid dtype for bias -
    should match query's dtype"): a skip, as torch's other refusals are. cuDNN takes one and computes with
    it (docs/torch-backends.md, "Defects": NaN from an fp32 bias beside bf16 inputs): those cases run."""
    if name == "sdpa-efficient" and attn_mask.dtype.is_floating_point and attn_mask.dtype != q.dtype:
        raise Unsupported(f"{name}: a float attn_mask must have the query's dtype ({q.dtype}), got {attn_mask.dtype}")


def _with_causal(attn_mask, sq: int, sk: int):
    """The case's attn_mask with the bottom-right causal mask folded in: a bool one and-ed, a float one
    -inf above the diagonal (masked_fill: a bias's gradient stays the caller's where it is kept)."""
    import torch

    from faverify.cases.masks import window_keep
    keep = window_keep(sq, sk, None, 0, attn_mask.device)
    if attn_mask.dtype == torch.bool:
        return attn_mask & keep
    return attn_mask.masked_fill(~keep, float("-inf"))


class _Capped(torch.autograd.Function):
    """cap * tanh(s / cap), with the derivative sech^2(s / cap) taken as the reference takes it
    (mods.sech2): autograd's 1 - tanh^2 is exactly 0 where fp32's tanh rounds to 1 (past |u| of about
    9), and dq and dk with it, where the true slope is still 1e-8 and below (a bf16 case with softcap 5 and
    scale 2 lost dq and dk of 3e-33 there, 3.6x the baseline's error)."""

    @staticmethod
    def forward(ctx, s, cap):
        u = s / cap
        ctx.save_for_backward(u)
        return cap * torch.tanh(u)

    @staticmethod
    def backward(ctx, grad):
        (u,) = ctx.saved_tensors
        return grad * sech2(u), None


def _variant_mask(qt, kt, vt, causal, softmax_scale, window_size, softcap, alibi_slopes, sinks, attn_mask=None):
    """The variants as one additive float mask on [b, h, sq, sk] heads-first tensors: softcap as the capped
    logits themselves (computed from q and k with autograd, so the gradient flows through them),
    ALiBi's bias, -inf outside the window (bottom-right aligned), and a sink as one more key of value 0
    whose logit the mask sets to z_h. Returns q, k, v (k and v extended for the sink) and the mask. The
    math backend runs it in fp32, as it runs 16-bit inputs on the CPU anyway (a reference-style subject:
    the variants of a 16-bit kernel are the other subjects' to show)."""
    import torch

    from faverify.cases.masks import window_keep
    b, h, sq, d = qt.shape
    sk = kt.shape[2]
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    rows = torch.arange(sq, device=qt.device)[:, None] + (sk - sq)  # each row's diagonal key
    cols = torch.arange(sk, device=qt.device)[None, :]
    bias = torch.zeros(1, 1, sq, sk, dtype=torch.float32, device=qt.device)
    if softcap:  # the capped logits are the whole mask, and q is 0 for SDPA's own: a correction c*tanh(s/c) - s
        # added to SDPA's logits would leave, where tanh saturates, a gradient that cancels only to rounding
        keys = kt.repeat_interleave(h // kt.shape[1], dim=1)
        s = qt @ keys.transpose(-1, -2) * scale
        bias = bias + _Capped.apply(s, softcap)
        qt = qt * 0
    if alibi_slopes is not None:
        slopes = alibi_slopes.reshape(-1, h, 1, 1)  # [1 | b, h, 1, 1]
        bias = bias - slopes * (rows - cols).abs().float()
    left, right = window_size if window_size is not None else (-1, -1)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    hidden = ~window_keep(sq, sk, None if left < 0 else left, None if right < 0 else right, qt.device)
    if attn_mask is not None:  # the case's own: a bool keep-mask or a float bias
        if attn_mask.dtype == torch.bool:
            hidden = hidden | ~attn_mask
        else:
            bias = bias + attn_mask.float()
    bias = bias.masked_fill(hidden, float("-inf"))
    if sinks is not None:
        bias = torch.cat([bias.expand(b, h, sq, sk),
                          sinks.float().reshape(1, h, 1, 1).expand(b, h, sq, 1)], dim=-1)
        kt = torch.cat([kt, kt.new_zeros(b, kt.shape[1], 1, d)], dim=2)
        vt = torch.cat([vt, vt.new_zeros(b, vt.shape[1], 1, vt.shape[3])], dim=2)
    return qt, kt, vt, bias.to(qt.dtype)
