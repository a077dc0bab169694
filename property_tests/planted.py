"""Subjects with one planted bug each, for the tests: faverify must catch every one of them.

Plain torch with autograd, in the subject signature (q, k, v, *, causal, softmax_scale) on [b, s, h, d].
"""
import math

import torch


def heads_first(q, k, v, softmax_scale):
    """q, k, v as fp32 [b, h, s, d] (k and v repeated over the query heads of their group), and the scale."""
    h, d = q.shape[2], q.shape[3]
    hk = k.shape[2]
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    qt = q.transpose(1, 2).float()
    kt = k.transpose(1, 2).float().repeat_interleave(h // hk, dim=1)
    vt = v.transpose(1, 2).float().repeat_interleave(h // hk, dim=1)
    return qt, kt, vt, scale


def _scores(q, k, v, *, causal, scale, mask_top_left=False):
    """q, k, v as fp32 [b, h, s, d] (k and v repeated over the query heads of their group) and the scaled,
    masked logits [b, h, sq, sk]."""
    sq, sk = q.shape[1], k.shape[1]
    qt, kt, vt, scale = heads_first(q, k, v, scale)
    s = qt @ kt.transpose(-1, -2) * scale
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i if mask_top_left else j > i + sk - sq, float("-inf"))
    return qt, kt, vt, s


def _attention(q, k, v, *, causal, scale, mask_top_left=False, accumulate=None, weights=None):
    b, sq, h, d = q.shape
    sk = k.shape[1]
    qt, kt, vt, s = _scores(q, k, v, causal=causal, scale=scale, mask_top_left=mask_top_left)
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


def names_its_threads(q, k, v, *, causal, softmax_scale):
    """Fails every case with torch's CPU thread count in its message: what the worker process was given."""
    raise RuntimeError(f"threads={torch.get_num_threads()}")


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


def faults_late(q, k, v, *, causal, softmax_scale):
    """On causal cases, a fault that surfaces only after it returns, in faverify's own code (a stand-in for a
    kernel's asynchronous CUDA fault, reported by the next call that synchronizes): faverify's next look at
    the inputs raises as a lost context does, once."""
    if causal:
        from faverify.run import evaluate
        looked = evaluate.changed_inputs

        def lost_context(*args, **kwargs):
            evaluate.changed_inputs = looked
            raise RuntimeError("CUDA error: unspecified launch failure (planted)")
        evaluate.changed_inputs = lost_context
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


def _on_incoming_grad(out, treat):
    """out as it is; its backward hands treat(dO) on instead of dO."""
    class _Hook(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, dout):
            return treat(dout)
    return _Hook.apply(out)


def _zeroed_after_copy(dout):
    grad = dout.clone()
    dout.zero_()  # the backward zeroes the dO it was handed
    return grad


def zeroes_dout(q, k, v, *, causal, softmax_scale):
    """Right forward and gradients, but its backward zeroes the incoming dO."""
    return _on_incoming_grad(correct(q, k, v, causal=causal, softmax_scale=softmax_scale), _zeroed_after_copy)


def writes_k_declared(q, k, v, *, causal, softmax_scale):
    """Writes into k after attending, as a kernel that appends to a cache it is given, and declares it."""
    out = correct(q, k, v, causal=causal, softmax_scale=softmax_scale)
    with torch.no_grad():
        k.add_(1)
    return out


writes_k_declared.faverify_capabilities = {"writes": ["k"], "backward": False}


def takes_multiples_of_16(q, k, v, *, causal, softmax_scale):
    """Right, for head dims that are multiples of 16, which it declares; any other head dim is an error (a
    failing case): a fuzz of it must draw none."""
    if q.shape[-1] % 16:
        raise RuntimeError(f"head dim {q.shape[-1]} is not a multiple of 16")
    return correct(q, k, v, causal=causal, softmax_scale=softmax_scale)


takes_multiples_of_16.faverify_capabilities = {"head_dim_multiple": 16}


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


# Variant subjects: flash-attn's keywords, fp32 with autograd; `variant_correct` is the control, each other
# plants one bug of the kind the trackers show.

class _DropsGradient(torch.autograd.Function):
    """The identity whose backward gives zeros: a kernel that returns lse with a graph and ignores dlse."""

    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, grad):
        return torch.zeros_like(grad)


def hidden_keys(sq: int, sk: int, causal: bool, window: tuple, device) -> torch.Tensor:
    """[sq, sk] True where row i may not see key j: bottom-right causal, window (left, right), -1 unbounded."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    diag = i + (sk - sq)
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    hidden = torch.zeros(sq, sk, dtype=torch.bool, device=device)
    if right >= 0:
        hidden |= j > diag + right
    if left >= 0:
        hidden |= j < diag - left
    return hidden


def _variant(q, k, v, *, causal, softmax_scale, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None,
             bug=None, return_max_logit=False):
    b, sq, h, d = q.shape
    sk = k.shape[1]
    qt, kt, vt, scale = heads_first(q, k, v, softmax_scale)
    s = qt @ kt.transpose(-1, -2)
    if softcap:
        s = softcap * torch.tanh(s / softcap) * scale if bug == "softcap-before-scale" else \
            softcap * torch.tanh(s * scale / softcap)
    else:
        s = s * scale
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    diag = i + (sk - sq)
    if alibi_slopes is not None:
        distance = (i - j).abs() if bug == "alibi-no-offset" else (diag - j).abs()
        s = s - alibi_slopes.reshape(-1, h, 1, 1) * distance
    left, right = window_size
    hidden = hidden_keys(sq, sk, causal, (left + (1 if bug == "window-off-by-one" and left >= 0 else 0), right),
                         q.device)
    unmasked = s
    s = s.masked_fill(hidden, float("-inf"))
    if sinks is not None:
        z = (sinks.detach() if bug == "sink-no-grad" else sinks).reshape(1, h, 1, 1).expand(b, h, sq, 1)
        full = torch.cat([s, z], dim=-1)
    else:
        full = s
    lse_all = torch.logsumexp(full, dim=-1)
    lse_keys = torch.logsumexp(s, dim=-1)
    # normalized by the sum of the weights, not by exp(lse): where fp32 cannot tell lse from the row's max
    # (logits near 7e10, whose ulp is 8192, beside log 2) exp(s - lse) sums to 2, out of its values' hull
    top = full.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    total = torch.exp(full - top).sum(dim=-1, keepdim=True)
    if bug == "off-by-one-unshifted" and sinks is not None and not sinks.any():
        # the off-by-one sink as a literal 1 in the denominator, where exp(0 - max) belongs
        total = torch.exp(s - top).sum(dim=-1, keepdim=True) + 1.0
        lse_all = (top + torch.log(total)).squeeze(-1)
    p = torch.where(total > 0, torch.exp(s - top) / total, torch.zeros_like(s))
    out = (p @ vt).transpose(1, 2).to(q.dtype)
    lse = lse_keys if bug == "sink-not-in-lse" else lse_all
    if bug == "dlse-ignored":  # lse keeps a graph, but a loss on it reaches nothing
        lse = _DropsGradient.apply(lse)
    elif bug == "dlse-into-dout":  # dlse added to every element of its row's dO: dv moves with it
        lse = lse + (out - out.detach()).float().sum(-1).transpose(1, 2)
    if return_max_logit:  # the largest logit each row sees; the planted bug's, over the masked keys too
        top = (unmasked if bug == "max-logit-unmasked" else s).amax(dim=-1).detach().float()
        return out, lse.float(), top.amax(dim=(0, 2)) if bug == "per-head" else top
    return out, lse.float()


_VARIANTS = {"window": True, "softcap": True, "alibi": True, "sinks": True, "head_dim_v": True, "lse": True}


def variant_correct(q, k, v, *, causal, softmax_scale, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                    sinks=None):
    """Every variant feature, right: the control."""
    return _variant(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size, softcap=softcap,
                    alibi_slopes=alibi_slopes, sinks=sinks)


def _planted(bug, caps=_VARIANTS):
    def fn(q, k, v, *, causal, softmax_scale, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None,
           return_max_logit=False):
        return _variant(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size,
                        softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks, bug=bug,
                        return_max_logit=return_max_logit)
    fn.__doc__ = f"Every variant feature, with one bug: {bug}." if bug else "Every variant feature, right."
    fn.faverify_capabilities = caps
    return fn


variant_correct.faverify_capabilities = _VARIANTS
window_off_by_one = _planted("window-off-by-one")  # keeps one key past the left bound
softcap_before_scale = _planted("softcap-before-scale")  # caps q.k, then scales
alibi_no_offset = _planted("alibi-no-offset")  # -slope * |i - j|, top-left instead of bottom-right
sink_not_in_lse = _planted("sink-not-in-lse")  # out right, lse of the keys alone
sink_no_grad = _planted("sink-no-grad")  # the sink detached: dsinks 0
off_by_one_unshifted = _planted("off-by-one-unshifted")  # the fixed sink's weight 1, not exp(-max)


def off_by_one_sink_given_a_gradient(q, k, v, *, causal, softmax_scale, window_size=(-1, -1), softcap=0.0,
                                     alibi_slopes=None, sinks=None):
    """Right, but steps the sink's logit by its gradient in the caller's buffer even where the sink is the
    fixed off-by-one 0 that asks none: the next call sees another sink."""
    out = _variant(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size, softcap=softcap,
                   alibi_slopes=alibi_slopes, sinks=sinks)
    if sinks is not None and not sinks.requires_grad:
        with torch.no_grad():
            sinks.sub_(0.5)
    return out


off_by_one_sink_given_a_gradient.faverify_capabilities = _VARIANTS
# a loss on lse (lse_grad): the control and two bugs of a backward that takes dlse
_LSE_GRAD = {**_VARIANTS, "lse_grad": True}
lse_grad_correct = _planted(None, _LSE_GRAD)
dlse_ignored = _planted("dlse-ignored", _LSE_GRAD)
dlse_into_dout = _planted("dlse-into-dout", _LSE_GRAD)
# the max logit: per row (the control), per head (declared so), and over masked keys too (the bug)
max_logit_correct = _planted(None, {**_VARIANTS, "max_logit": True})
max_logit_per_head = _planted("per-head", {**_VARIANTS, "max_logit": True, "conventions": {"max_logit": "head"}})
max_logit_unmasked = _planted("max-logit-unmasked", {**_VARIANTS, "max_logit": True})


def _shared_kv(q, k, v, causal, softmax_scale, tail: bool):
    """An MLA-style kernel that sees v in k's storage and reads it from k's rows: its leading columns (right)
    or, the planted bug, its trailing ones (the rotary part's side of the latent). The values are read from
    k; the gradients still go to v, as a kernel's own backward returns them."""
    if v.data_ptr() == k.data_ptr() and v.shape[-1] <= k.shape[-1]:
        read = k[..., k.shape[-1] - v.shape[-1]:] if tail else k[..., :v.shape[-1]]
        v = v + (read.detach() - v.detach())
    return _variant(q, k, v, causal=causal, softmax_scale=softmax_scale)[0]


def shared_kv_correct(q, k, v, *, causal, softmax_scale):
    """Reads v from k's storage where they share it, as k[..., :dv]: the control."""
    return _shared_kv(q, k, v, causal, softmax_scale, tail=False)


def shared_kv_reads_tail(q, k, v, *, causal, softmax_scale):
    """Reads a shared v as k's last dv columns, where it is k's first: right wherever dv == d."""
    return _shared_kv(q, k, v, causal, softmax_scale, tail=True)


for _fn in (shared_kv_correct, shared_kv_reads_tail):
    _fn.faverify_capabilities = {"kv_shared": True, "head_dim_v": True, "max_head_dim": 576}


def declares_window_without_keyword(q, k, v, *, causal, softmax_scale):
    """Declares windows but has no window_size keyword: refused before any case."""
    return correct(q, k, v, causal=causal, softmax_scale=softmax_scale)


declares_window_without_keyword.faverify_capabilities = {"window": True}


# The same subjects under other libraries' conventions (faverify.cases.conventions.PRESETS): each passes when it
# declares what it does.

def lse_base2(q, k, v, *, causal, softmax_scale):
    """with_lse (lse in log2 units), declaring FlashInfer's conventions: lse base 2."""
    return with_lse(q, k, v, causal=causal, softmax_scale=softmax_scale)


lse_base2.faverify_capabilities = {"conventions": "flashinfer"}


def causal_top_left(q, k, v, *, causal, softmax_scale):
    """top_left_mask, declaring torch SDPA's conventions: causal top-left."""
    return top_left_mask(q, k, v, causal=causal, softmax_scale=softmax_scale)


causal_top_left.faverify_capabilities = {"conventions": "torch-sdpa", "backward": False}


def empty_rows_lse_plus_inf(q, k, v, *, causal, softmax_scale):
    """variant_correct's lse with +inf where a row sees no key, as flash-attn 2 gives it."""
    out, lse = variant_correct(q, k, v, causal=causal, softmax_scale=softmax_scale)
    return out, torch.where(lse == float("-inf"), torch.full_like(lse, float("inf")), lse)


empty_rows_lse_plus_inf.faverify_capabilities = {"conventions": "flash-attn-2"}


def alibi_relative(q, k, v, *, causal, softmax_scale, alibi_slopes=None):
    """ALiBi as a * (j - diagonal), FlashInfer's and cuDNN's form."""
    b, sq, h, d = q.shape
    sk = k.shape[1]
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    bias = alibi_slopes.reshape(-1, h, 1, 1) * (j - (i + sk - sq)) if alibi_slopes is not None else None
    qt, kt, vt = (t.transpose(1, 2).float() for t in (q, k, v))
    kt, vt = (t.repeat_interleave(h // k.shape[2], dim=1) for t in (kt, vt))
    s = qt @ kt.transpose(-1, -2) * (d ** -0.5 if softmax_scale is None else softmax_scale)
    if bias is not None:
        s = s + bias
    if causal:
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    return (torch.softmax(s, -1).nan_to_num(0.0) @ vt).transpose(1, 2).to(q.dtype)


alibi_relative.faverify_capabilities = {"alibi": True, "conventions": "cudnn"}


def reads_one_key_past_the_end(q, k, v, *, causal, softmax_scale):
    """Attends over one key more than it was given, read from past the end of k and v: the NaN margins
    around every input make that a NaN the verdict cannot miss."""
    b, sk, hk, d = k.shape
    wider = tuple(k.shape[:1]) + (sk + 1,) + tuple(k.shape[2:])
    k1 = torch.as_strided(k, wider, k.stride(), k.storage_offset())
    v1 = torch.as_strided(v, wider, v.stride(), v.storage_offset())
    return correct(q.detach(), k1.detach(), v1.detach(), causal=False, softmax_scale=softmax_scale)


reads_one_key_past_the_end.faverify_capabilities = {"backward": False}

_RUNS = {"n": 0}


def nondeterministic(q, k, v, *, causal, softmax_scale):
    """Moves out by one ulp on every other call, as an atomic-add reduction in another order does: inside
    the tolerance, caught only by running the case twice."""
    _RUNS["n"] += 1
    out = correct(q, k, v, causal=causal, softmax_scale=softmax_scale)
    if _RUNS["n"] % 2:
        bits = {2: torch.int16, 4: torch.int32}[out.element_size()]
        nudged = (out.detach().contiguous().view(bits) + 1).view(out.dtype)
        out = out + torch.where(out != 0, nudged - out.detach(), torch.zeros_like(out))
    return out


# Dense bugs from the trackers, each caught only by the regime or layout made for it (vocabulary.REGIMES, LAYOUTS).

FINITE_SENTINEL = -5e4  # FlashInfer's math::inf stands for -inf


def finite_sentinel(q, k, v, *, causal, softmax_scale):
    """Starts the running max at a finite -inf (-5e4) and never lets it fall below: a row whose every logit
    is below that gets exp(s - m) = 0 for every key, and out 0."""
    qt, kt, vt, s = _scores(q, k, v, causal=causal, scale=softmax_scale)
    m = s.amax(dim=-1, keepdim=True).clamp(min=FINITE_SENTINEL)
    p = torch.exp(s - m)
    denom = p.sum(dim=-1, keepdim=True)
    o = torch.where(denom > 0, (p @ vt) / denom.clamp(min=1e-30), torch.zeros_like(p @ vt))
    return o.transpose(1, 2).to(q.dtype)


class _ExpOfLse(torch.autograd.Function):
    """Right forward; the backward recomputes P as exp(s - c) / exp(lse - c) with c = max(lse, 0): guarded
    against overflow, not against underflow, so a row with lse < -88.7 (exp underflows in fp32) gets 0 / 0."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        qt, kt, vt, s = _scores(q, k, v, causal=causal, scale=scale)
        lse = torch.logsumexp(s, dim=-1)
        out = torch.exp(s - lse[..., None]).nan_to_num(0.0) @ vt
        ctx.save_for_backward(q, k, v, lse)
        ctx.causal, ctx.scale = causal, scale
        return out.transpose(1, 2).to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, lse = ctx.saved_tensors
        b, sq, h, d = q.shape
        hk = k.shape[2]
        scale = d ** -0.5 if ctx.scale is None else ctx.scale
        qt, kt, vt, s = _scores(q, k, v, causal=ctx.causal, scale=ctx.scale)
        c = lse.clamp(min=0)[..., None]
        p = torch.exp(s - c) / torch.exp(lse[..., None] - c)
        p = torch.where(torch.isneginf(lse)[..., None], torch.zeros_like(p), p)  # rows that see no key
        do = dout.transpose(1, 2).float()
        dp = do @ vt.transpose(-1, -2)
        ds = p * (dp - (p * dp).sum(dim=-1, keepdim=True))
        dq = ds @ kt * scale
        dk, dv = (ds.transpose(-1, -2) @ qt * scale), p.transpose(-1, -2) @ do

        def per_kv_head(t):
            return t.reshape(b, hk, h // hk, *t.shape[2:]).sum(2).transpose(1, 2).to(k.dtype)
        return dq.transpose(1, 2).to(q.dtype), per_kv_head(dk), per_kv_head(dv), None, None


def exp_of_lse(q, k, v, *, causal, softmax_scale):
    """Its backward takes exp of a row's lse in fp32 (cudnn-frontend#1072): NaN gradients where lse < -88.7."""
    return _ExpOfLse.apply(q, k, v, causal, softmax_scale)


def _contiguous_strides(shape) -> list:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return strides[::-1]


def zero_stride_as_unset(q, k, v, *, causal, softmax_scale):
    """Takes a stride of 0 for "not given" and reads that axis of k and v as if they were contiguous: an
    expand over batch or heads is read from memory past the one copy there is."""
    def restrided(t):
        strides = [s or c for s, c in zip(t.stride(), _contiguous_strides(t.shape))]
        return torch.as_strided(t.detach(), t.shape, strides, t.storage_offset())
    return correct(q.detach(), restrided(k), restrided(v), causal=causal, softmax_scale=softmax_scale)


zero_stride_as_unset.faverify_capabilities = {"backward": False}


def reads_dout_contiguous(q, k, v, *, causal, softmax_scale):
    """Right forward; the backward reads dO's memory as if it were contiguous (diffusers#9768: dO from a
    transpose)."""
    def as_contiguous(dout):
        return torch.as_strided(dout, dout.shape, _contiguous_strides(dout.shape), dout.storage_offset()).clone()
    return _on_incoming_grad(correct(q, k, v, causal=causal, softmax_scale=softmax_scale), as_contiguous)


def tile_edge_row(q, k, v, *, causal, softmax_scale):
    """Right but for the first query row past each 64-row tile, whose output is scaled by 1.1: a bug on a tile
    edge, which `repro --plot` shows as a line. Declares its tile."""
    out = _attention(q, k, v, causal=causal, scale=softmax_scale)
    edge = torch.zeros(out.shape[1], dtype=torch.bool, device=out.device)
    edge[64::64] = True
    return torch.where(edge[None, :, None, None], out * 1.1, out)


tile_edge_row.faverify_capabilities = {"tile": [64, 64]}


def one_length_128(q, k, v, *, causal, softmax_scale):
    """Right, on q and k of one length, a multiple of 128 (Triton's tutorial flash attention takes no other):
    any other case raises ValueError, which skips it. Declares the lengths it takes."""
    if q.shape[1] != k.shape[1] or q.shape[1] % 128:
        raise ValueError(f"takes seqlen_q == seqlen_k, a multiple of 128; got {q.shape[1]} and {k.shape[1]}")
    return _attention(q, k, v, causal=causal, scale=softmax_scale)


one_length_128.faverify_capabilities = {"equal_seqlens": True, "seqlen_multiple": 128}


def one_length_undeclared(q, k, v, *, causal, softmax_scale):
    """Right, on q and k of one length alone, declaring nothing: most cases drawn for it are skipped."""
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"takes seqlen_q == seqlen_k; got {q.shape[1]} and {k.shape[1]}")
    return _attention(q, k, v, causal=causal, scale=softmax_scale)
