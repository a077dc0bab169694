"""Subjects with one planted bug each, for the tests: faverify must catch every one of them.

Plain torch with autograd, in the subject signature (q, k, v, *, causal, softmax_scale) on [b, s, h, d].
"""
import math

import torch


def _attention(q, k, v, *, causal, scale, mask_top_left=False, accumulate=None, weights=None):
    b, sq, h, d = q.shape
    scale = d ** -0.5 if scale is None else scale
    sk, hk = k.shape[1], k.shape[2]
    qt = q.transpose(1, 2).float()
    kt = k.transpose(1, 2).float().repeat_interleave(h // hk, dim=1)
    vt = v.transpose(1, 2).float().repeat_interleave(h // hk, dim=1)
    s = qt @ kt.transpose(-1, -2) * scale
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i if mask_top_left else j > i + sk - sq, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    if weights is not None:  # the attention weights rounded to another dtype before P @ V
        p = p.to(weights).float()
    if accumulate is None:
        o = p @ vt  # fp32 throughout: a cast of P would also cast dP = dO V^T, which overflows fp16
    else:  # partial sums of 16 keys added into an accumulator of dtype `accumulate`
        o = torch.zeros(b, h, sq, d, dtype=accumulate, device=q.device)
        for j0 in range(0, sk, 16):
            o = (o + (p[..., j0:j0 + 16] @ vt[:, :, j0:j0 + 16]).to(accumulate)).to(accumulate)
    return o.float().transpose(1, 2).to(q.dtype)


def correct(q, k, v, *, causal, softmax_scale):
    """The same code with no bug planted: the control."""
    return _attention(q, k, v, causal=causal, scale=softmax_scale)


def wrong_scale(q, k, v, *, causal, softmax_scale):
    """Scales logits by 1/d instead of the given softmax_scale."""
    return _attention(q, k, v, causal=causal, scale=1.0 / q.shape[-1])


def fp16_accumulation(q, k, v, *, causal, softmax_scale):
    """Accumulates P @ V in fp16."""
    return _attention(q, k, v, causal=causal, scale=softmax_scale, accumulate=torch.float16)


def bf16_weights(q, k, v, *, causal, softmax_scale):
    """Rounds P to bf16 for P @ V whatever the inputs' dtype: in fp16, 8 times the rounding of P the
    naive fp16 computation makes (forward only)."""
    with torch.no_grad():
        return _attention(q, k, v, causal=causal, scale=softmax_scale, weights=torch.bfloat16)


def top_left_mask(q, k, v, *, causal, softmax_scale):
    """Masks causal rows top-left aligned (torch's is_causal) instead of bottom-right."""
    return _attention(q, k, v, causal=causal, scale=softmax_scale, mask_top_left=True)


def raises_type_error(q, k, v, *, causal, softmax_scale):
    """Crashes on causal cases: an exception other than ValueError is a failure."""
    if causal:
        raise TypeError("planted crash")
    return correct(q, k, v, causal=causal, softmax_scale=softmax_scale)


def declines_fp32(q, k, v, *, causal, softmax_scale):
    """Declares fp32 unsupported by raising NotImplementedError: a skip, never a pass."""
    if q.dtype == torch.float32:
        raise NotImplementedError("fp32 is not implemented")
    return correct(q, k, v, causal=causal, softmax_scale=softmax_scale)


def with_lse(q, k, v, *, causal, softmax_scale):
    """Returns (out, lse) with lse in log2 units: caught through lse alone."""
    out = correct(q, k, v, causal=causal, softmax_scale=softmax_scale)
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    s = (q.transpose(1, 2).float() @ k.transpose(1, 2).float().repeat_interleave(h // hk, 1).transpose(-1, -2))
    s = s * (d ** -0.5 if softmax_scale is None else softmax_scale)
    if causal:
        i = torch.arange(sq)[:, None]
        j = torch.arange(sk)[None, :]
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    return out, torch.logsumexp(s, dim=-1) / math.log(2)


def segfaults(q, k, v, *, causal, softmax_scale):
    """Kills its process on causal cases (a stand-in for a CUDA fault that takes the context down)."""
    if causal:
        import ctypes
        ctypes.string_at(0)  # read from address 0: SIGSEGV
    return correct(q, k, v, causal=causal, softmax_scale=softmax_scale)


def hangs(q, k, v, *, causal, softmax_scale):
    """Never returns when seqlen_q > 100 (a stand-in for a kernel that deadlocks)."""
    if q.shape[1] > 100:
        import time
        time.sleep(3600)
    return correct(q, k, v, causal=causal, softmax_scale=softmax_scale)


# Subjects that change their inputs in place: judged against references from the inputs as they were.

def zeroes_q(q, k, v, *, causal, softmax_scale):
    """Right output, then zeroes q in place."""
    out = correct(q, k, v, causal=causal, softmax_scale=softmax_scale)
    with torch.no_grad():
        q.zero_()
    return out


def doubles_q(q, k, v, *, causal, softmax_scale):
    """Doubles q in place first: its output is right for the doubled q, wrong for the one it was given."""
    with torch.no_grad():
        q.mul_(2)
    return correct(q, k, v, causal=causal, softmax_scale=softmax_scale)


def copies_v_into_k(q, k, v, *, causal, softmax_scale):
    """Overwrites k with v before attending."""
    with torch.no_grad():
        k.copy_(v)
    return correct(q, k, v, causal=causal, softmax_scale=softmax_scale)


class _ZeroesIncomingGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out):
        return out.view_as(out)

    @staticmethod
    def backward(ctx, dout):
        grad = dout.clone()
        dout.zero_()  # the backward zeroes the dO it was handed
        return grad


def zeroes_dout(q, k, v, *, causal, softmax_scale):
    """Right forward and gradients, but its backward zeroes the incoming dO."""
    return _ZeroesIncomingGrad.apply(correct(q, k, v, causal=causal, softmax_scale=softmax_scale))


def writes_k_declared(q, k, v, *, causal, softmax_scale):
    """Writes into k after attending, as a kernel that appends to a cache it is given, and declares it."""
    out = correct(q, k, v, causal=causal, softmax_scale=softmax_scale)
    with torch.no_grad():
        k.add_(1)
    return out


writes_k_declared.faverify_capabilities = {"writes": ["k"], "backward": False}


def exits_zero(q, k, v, *, causal, softmax_scale):
    """Calls sys.exit(0) on causal cases: a case that never returned, not a pass."""
    if causal:
        import sys
        sys.exit(0)
    return correct(q, k, v, causal=causal, softmax_scale=softmax_scale)


def os_exits_zero(q, k, v, *, causal, softmax_scale):
    """Ends its process with os._exit(0) on causal cases."""
    if causal:
        import os
        os._exit(0)
    return correct(q, k, v, causal=causal, softmax_scale=softmax_scale)


def raises_keyboard_interrupt(q, k, v, *, causal, softmax_scale):
    """Raises KeyboardInterrupt itself on causal cases: the kernel's failure, not the user's Ctrl-C."""
    if causal:
        raise KeyboardInterrupt("planted")
    return correct(q, k, v, causal=causal, softmax_scale=softmax_scale)


def returns_on_meta(q, k, v, *, causal, softmax_scale):
    """Returns out on another device than its inputs'."""
    return correct(q, k, v, causal=causal, softmax_scale=softmax_scale).to("meta")
