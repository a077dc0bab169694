"""Attention forward and backward by explicit formulas, chunked over query rows.

One implementation serves two purposes:
- the FP64 reference (compute in float64, nothing rounded), the truth every subject is judged against;
- the naive baseline (`naive`): the same formulas computed in float32 and rounded to the case's
  dtype after every operation, as `softmax(q @ k.T * scale) @ v` written in that dtype does it.

Memory is O(chunk * seqlen_k): the chunk of query rows is sized from a byte budget, and dk/dv are
accumulated across chunks. Conventions (docs/design.md): layout [b, s, h, d], k/v heads shared by groups of
h // h_k query heads, causal aligned bottom-right, a row that sees no key gives out 0, lse -inf, dq 0.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import torch

from faverify.cases.mods import sech2
from faverify.cases.variant import Variant
from faverify.judge.flash_bound import FP32_DOT, Dot
from faverify.judge.scales import ScaleAccumulator, add_rows

Tensors = dict  # name -> tensor: out [b,sq,h,dv], lse [b,h,sq], dq [b,sq,h,d], dk [b,sk,hk,d], dv [b,sk,hk,dv],
# dsinks [h], dbias the bias's shape [b|1, h|1, sq|1, sk]


_CHUNK_BUDGET = {"cpu": 64 << 20, "cuda": 1 << 30}  # bytes for one chunk's [rows x seqlen_k] temporaries
_TEMPORARIES = 6  # s, p, dp, ds and two products alive at once


def bytes_needed(b: int, sq: int, sk: int, h: int, hk: int, d: int, elem: int, device: str, backward: bool,
                 judged: int | None = None) -> int:
    """About how much memory one case takes on its device: the inputs and the subject's outputs in their
    dtype (a few copies), the reference's FP64 tensors (q, dO, out, dq over sq; k, v over sk; dk and dv per
    query head), and one chunk of the [rows x seqlen_k] temporaries (at least one row). The naive baseline
    works in fp32 over the same shapes, within this. judged: the batch entries the reference is computed
    on, where fewer than b (a large case's: cases/large.judged_entries)."""
    dtype_side = elem * 4 * (2 * b * sq * h * d + 2 * b * sk * hk * d)  # inputs, pristine copies, outputs, gradients
    r = b if judged is None else judged  # the reference's entries
    fp64 = 8 * r * ((4 if backward else 2) * sq * h * d + 2 * sk * hk * d + (2 * sk * h * d if backward else 0))
    chunk = max(_CHUNK_BUDGET["cuda" if device == "cuda" else "cpu"], _TEMPORARIES * r * h * sk * 8)
    return dtype_side + fp64 + chunk


def reference(q, k, v, dout=None, *, causal: bool, scale: float, variant: Variant | None = None,
              dlse=None, max_logit: bool = False, dot: Dot = FP32_DOT) -> tuple[Tensors, dict]:
    """FP64 outputs (and gradients when dout is given), plus the magnitude scale of each tensor.

    A scale is the size of the terms summed to produce a tensor (see scales.ScaleAccumulator), not the size of
    the result: dk is exactly zero when seqlen_k == 1, but the terms that cancelled to give that zero are
    not, and rounding them costs a kernel about u times their size.
    dlse: [b, h, sq], a loss's gradient on lse (natural log) beside dout's on out: each row's logits take
    p * dlse more (d lse / d s = p), and its sink p_sink * dlse. max_logit: the largest logit each row sees
    (after softcap, ALiBi and bias; the sink is no key), [b, h, sq], -inf where it sees none. dot: how the
    kernel sums its logits (flash_bound.Dot: FP8 tensor cores keep fewer bits), for the scales' flash terms.
    """
    return _attention(q, k, v, dout, scale=scale, variant=variant or Variant.dense(causal), compute=torch.float64,
                      round_to=None, with_scales=True, dlse=dlse, max_logit=max_logit, dot=dot)


def naive(q, k, v, dout=None, *, causal: bool, scale: float, variant: Variant | None = None,
          dlse=None, max_logit: bool = False) -> Tensors:
    """The same formulas in the inputs' dtype: fp32 arithmetic, rounded to q.dtype after every op."""
    tensors, _ = _attention(q, k, v, dout, scale=scale, variant=variant or Variant.dense(causal),
                            compute=torch.float32, round_to=q.dtype, with_scales=False, dlse=dlse,
                            max_logit=max_logit)
    return tensors


def _attention(q, k, v, dout, *, scale, variant, compute, round_to, with_scales, dlse=None, max_logit=False,
               dot=FP32_DOT):
    st = _setup(q, k, v, dout, variant, compute, round_to, with_scales, scale, dot)
    st.max_logit = torch.full_like(st.lse, float("-inf")) if max_logit else None
    # [b, hk, g, sq, 1], as the rows' statistics are (fp32 draws: exact in either compute dtype)
    st.dlse = None if dlse is None or not st.backward else dlse.to(compute).reshape(st.b, st.hk, st.g, st.sq, 1)
    if st.sk == 0 and st.sink is not None:  # no key: the sink alone is the softmax, lse its logit, out 0
        st.lse[:] = st.sink.reshape(1, st.hk, st.g, 1)
    if st.sk > 0:
        budget = _CHUNK_BUDGET.get(st.dev.type, _CHUNK_BUDGET["cuda"])
        chunk = max(1, budget // (_TEMPORARIES * st.b * st.h * st.sk * torch.finfo(compute).bits // 8))
        for i0 in range(0, st.sq, chunk):
            _rows_of(st, variant, i0, min(st.sq, i0 + chunk))
    return _finish(st, variant, compute, round_to)


def _setup(q, k, v, dout, variant, compute, round_to, with_scales, scale, dot) -> SimpleNamespace:
    """The inputs per kv head and group, the variant's tensors in that shape, and the zeroed outputs: the
    state every chunk of rows reads and adds to."""
    b, sq, h, d = q.shape
    sk, hk, dv = k.shape[1], k.shape[2], v.shape[3]
    g = h // hk
    dev = q.device

    def heads(t, n):  # [b, s, n, e] -> [b, hk, n // hk, s, e], query head i reads kv head i // g
        return t.to(compute).permute(0, 2, 1, 3).reshape(b, hk, n // hk, t.shape[1], t.shape[3])

    st = SimpleNamespace(b=b, sq=sq, h=h, d=d, sk=sk, hk=hk, dv=dv, g=g, dev=dev, scale=scale,
                         backward=dout is not None, cap=float(variant.softcap), mod=variant.score_mod,
                         rnd=(lambda t: t.to(round_to).to(compute)) if round_to is not None else (lambda t: t),
                         exact=round_to is None, out_tiny=torch.finfo(q.dtype).tiny)  # the kernel out's smallest normal
    st.Q, st.K, st.V = heads(q, h), heads(k, hk), heads(v, hk)  # K, V: [b, hk, 1, sk, d|dv]
    if variant.mask is not None:  # mask_nan's keys, which no row sees
        st.K, st.V = st.K.nan_to_num(nan=0.0), st.V.nan_to_num(nan=0.0)
    st.mask, st.bias, st.mult = (_five(t, h, hk) for t in (variant.mask, variant.bias, variant.multiplicity))
    if st.bias is not None:
        st.bias = st.bias.to(compute)
    st.dO = heads(dout, h) if st.backward else None
    st.slopes = None
    if variant.alibi_slopes is not None:  # [h] or [b, h] -> [b | 1, hk, g, 1, 1]
        a = variant.alibi_slopes.to(compute)
        st.slopes = a.reshape(-1, hk, g, 1, 1) if a.dim() == 2 else a.reshape(1, hk, g, 1, 1)
    st.sink = variant.sinks.detach().to(compute).reshape(1, hk, g, 1, 1) if variant.sinks is not None else None
    st.out = torch.zeros(b, hk, g, sq, dv, dtype=compute, device=dev)
    st.lse = torch.full((b, hk, g, sq), float("-inf"), dtype=compute, device=dev)
    grads = st.backward
    st.dq = torch.zeros(b, hk, g, sq, d, dtype=compute, device=dev) if grads else None
    st.dk_heads = torch.zeros(b, hk, g, sk, d, dtype=compute, device=dev) if grads else None
    st.dv_heads = torch.zeros(b, hk, g, sk, dv, dtype=compute, device=dev) if grads else None
    learned = st.sink is not None and variant.sinks_learned
    st.dsinks = torch.zeros(hk, g, dtype=compute, device=dev) if grads and learned else None
    st.dbias = torch.zeros(variant.bias.shape, dtype=compute, device=dev) if grads and st.bias is not None else None
    half_step = torch.finfo(q.dtype).smallest_normal * torch.finfo(q.dtype).eps / 2  # half a subnormal step
    weight_unit = torch.finfo(q.dtype).eps / 2  # a duplicate key's weight as a bias in q's dtype (flash_bound)
    st.acc = ScaleAccumulator(st.Q, st.K, st.V, st.dO, scale, st.slopes, st.sink, sq,
                              half_step, dot, weight_unit) if with_scales else None
    st.cols = torch.arange(sk, device=dev)
    return st


def _logits(st: SimpleNamespace, variant: Variant, i0: int, i1: int) -> tuple:
    """Rows i0..i1's logits after the softcap, ALiBi, bias, score_mod and the keys' multiplicity, hidden keys
    at -inf; with the slopes softcap and score_mod leave on their gradient, and the multiplicity's log n."""
    rnd = st.rnd
    s = rnd(rnd(st.Q[:, :, :, i0:i1] @ st.K.transpose(-1, -2)) * st.scale)  # [b, hk, g, c, sk]
    cap_slope = mod_slope = None
    if st.cap > 0:
        u = rnd(s / st.cap)
        s = rnd(st.cap * torch.tanh(u))
        cap_slope = rnd(sech2(u))
    offset = st.sk - st.sq if variant.offset is None else variant.offset
    diag = torch.arange(i0, i1, device=st.dev)[:, None] + offset  # each row's diagonal key
    if st.slopes is not None:
        cols = st.cols[None, :]
        distance = (cols - diag) if variant.alibi_form == "relative" else -(diag - cols).abs()
        s = rnd(s + rnd(st.slopes * distance.to(s.dtype)))
    if st.bias is not None:
        s = rnd(s + _rows(st.bias, i0, i1))
    if st.mod is not None:
        s, mod_slope = _modded(st.mod, s, i0, i1, st.g)
        s = rnd(s)
    if st.acc is not None and (st.bias is not None or st.mod is not None):
        st.acc.add_logits(s)
    s = s.masked_fill(_hidden(variant, st.mask, i0, i1, st.cols, diag), float("-inf"))
    if st.max_logit is not None:  # the logits a row sees, before any key's multiplicity
        st.max_logit[:, :, :, i0:i1] = s.amax(dim=-1)
    multiplicity = None
    if st.mult is not None:  # a key listed n times weighs n exp(s) = exp(s + log n); a hidden key stays -inf
        multiplicity = _rows(st.mult.to(s.dtype), i0, i1)
        s = s + multiplicity
    return s, cap_slope, mod_slope, multiplicity


def _rows_of(st: SimpleNamespace, variant: Variant, i0: int, i1: int) -> None:
    """Rows i0..i1: their softmax, out and lse, and their part of every gradient."""
    s, cap_slope, mod_slope, multiplicity = _logits(st, variant, i0, i1)
    m = s.amax(dim=-1, keepdim=True)
    if st.sink is not None:
        m = torch.maximum(m, st.sink.expand_as(m))
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)  # guard: never (-inf) - (-inf)
    p = torch.exp(s - m)
    l = p.sum(dim=-1, keepdim=True)
    p_sink = None
    if st.sink is not None:
        p_sink = torch.exp(st.sink - m)  # [b, hk, g, c, 1]
        l = l + p_sink
    seen = l > 0
    ones = torch.ones_like(l)
    st.lse[:, :, :, i0:i1] = torch.where(seen, m + torch.log(torch.where(seen, l, ones)), float("-inf")).squeeze(-1)
    p = st.rnd(torch.where(seen, p / torch.where(seen, l, ones), torch.zeros_like(p)))
    o = st.rnd(p @ st.V)
    st.out[:, :, :, i0:i1] = o
    if st.acc is not None:
        st.acc.add_forward(i0, i1, s, p, m, st.lse[:, :, :, i0:i1], _slope(cap_slope, mod_slope), multiplicity)
    if st.backward:
        sink_weight = p_sink / torch.where(seen, l, ones) if p_sink is not None else None
        _backward_rows(st, variant, i0, i1, p, o, sink_weight, cap_slope, mod_slope)


def _backward_rows(st: SimpleNamespace, variant: Variant, i0: int, i1: int, p, o, sink_weight, cap_slope,
                   mod_slope) -> None:
    rnd = st.rnd
    dOc, Qc = st.dO[:, :, :, i0:i1], st.Q[:, :, :, i0:i1]
    dp = rnd(dOc @ st.V.transpose(-1, -2))
    if st.exact:
        D = (dOc * o).sum(dim=-1, keepdim=True)  # rowsum(dO * O) == rowsum(dP * P) exactly
    else:
        D = (dp * p).sum(dim=-1, keepdim=True)  # what torch's softmax backward computes
    dlse = st.dlse[:, :, :, i0:i1] if st.dlse is not None else 0.0
    ds = rnd(p * (dp - D + dlse))  # the gradient of the logits after cap, bias and masks
    if st.dsinks is not None:  # the sink's own logit: its dP is 0 (no value)
        st.dsinks += (rnd(sink_weight) * (dlse - D)).sum(dim=(0, 3, 4))
    if mod_slope is not None:
        ds = rnd(ds * mod_slope)
    D_terms = _d_terms(st, dOc, o, i0, i1) if st.acc is not None else None
    if st.dbias is not None:  # the gradient of the logit where the bias was added
        add_rows(st.dbias, ds, i0, i1)
        if st.acc is not None:
            st.acc.add_dbias(variant.bias.shape, i0, i1, p * (dp.abs() + D_terms)
                             * (mod_slope.abs() if mod_slope is not None else 1.0))
    if cap_slope is not None:
        ds = rnd(ds * cap_slope)
    ds = rnd(ds * st.scale)
    st.dq[:, :, :, i0:i1] = rnd(ds @ st.K)
    st.dk_heads += ds.transpose(-1, -2) @ Qc
    st.dv_heads += p.transpose(-1, -2) @ dOc
    if st.acc is not None:
        st.acc.add_backward(i0, i1, p, dp, D_terms, _slope(cap_slope, mod_slope), sink_weight,
                            capped=cap_slope is not None)


def _d_terms(st: SimpleNamespace, dOc, o, i0: int, i1: int):
    """The magnitude of what each dS term subtracts from dP: D's terms |dO| |O|, and dlse beside D (a loss on
    lse), [b, hk, g, c, 1]. A kernel's D reads out rounded to its dtype, whose elements below the smallest
    normal carry an error of half a subnormal step (u * tiny) whatever their size: there out's magnitude is
    tiny's (an fp16 out near 1e-7 put dsinks at 1.7x the error allowed on the H200)."""
    D_terms = (dOc.abs() * o.abs().clamp(min=st.out_tiny)).sum(dim=-1, keepdim=True)
    if st.dlse is not None:
        D_terms = D_terms + st.dlse[:, :, :, i0:i1].abs()
    return D_terms


def _finish(st: SimpleNamespace, variant: Variant, compute, round_to) -> tuple:
    """The outputs in the callers' layout ([b, s, h, e], lse [b, h, s]) and the scales of their terms."""
    b, sq, h, rnd = st.b, st.sq, st.h, st.rnd
    tensors = {"out": rnd(st.out).reshape(b, h, sq, st.dv).permute(0, 2, 1, 3), "lse": rnd(st.lse).reshape(b, h, sq)}
    if st.max_logit is not None:  # a max of rounded logits: no rounding of its own
        tensors["max_logit"] = st.max_logit.reshape(b, h, sq)
    if st.backward:
        # a naive GQA user expands k/v per head; autograd sums the per-head gradients in the dtype
        tensors["dq"] = st.dq.reshape(b, h, sq, st.d).permute(0, 2, 1, 3)
        tensors["dk"] = rnd(rnd(st.dk_heads).sum(dim=2)).permute(0, 2, 1, 3)
        tensors["dv"] = rnd(rnd(st.dv_heads).sum(dim=2)).permute(0, 2, 1, 3)
        if st.dsinks is not None:
            tensors["dsinks"] = rnd(st.dsinks).reshape(h)
        if st.dbias is not None:
            tensors["dbias"] = rnd(st.dbias)
    scales = st.acc.result(tensors["lse"], st.backward) if st.acc is not None else {}
    if "max_logit" in tensors and st.acc is not None:  # a logit: its error is the logits' own
        scales["max_logit"] = scales["logit"]
    if st.acc is not None and "dbias" in tensors and "dbias" not in scales:  # no key: no term at all
        scales["dbias"] = torch.zeros((), dtype=compute, device=st.dev)
    if round_to is not None:  # already rounded: the cast is exact (dsinks stays fp32, as the sinks are)
        keep = {"dsinks": torch.float32, "dbias": variant.bias.dtype if variant.bias is not None else None,
                "max_logit": torch.float32}
        tensors = {name: t.to(keep.get(name) or round_to) for name, t in tensors.items()}
    return tensors, scales


def _slope(cap_slope, mod_slope):
    """What moves a logit per unit of its q.k (softcap's sech^2) or of its input (a score_mod's derivative)."""
    return cap_slope if cap_slope is not None else mod_slope.abs() if mod_slope is not None else None


def _hidden(variant: Variant, mask, i0: int, i1: int, cols, diag) -> torch.Tensor:
    """The keys rows i0..i1 may not see, True where hidden: [c, sk], or broadcast with a mask's [B, hk|1,
    g|1, c, sk] (_five)."""
    hidden = torch.zeros(i1 - i0, cols.numel(), dtype=torch.bool, device=cols.device)
    if mask is not None:
        hidden = hidden | ~_rows(mask, i0, i1)
    if variant.right is not None:
        hidden |= cols[None, :] > diag + variant.right
    if variant.left is not None:
        hidden |= cols[None, :] < diag - variant.left
    return hidden


_HULL_BUDGET = 64 << 20  # bytes of one chunk's [rows, keys, head dim] temporaries in value_hull


def value_hull(q, k, v, *, causal: bool, variant: Variant | None = None) -> tuple:
    """(lo, hi) [b, sq, h, dv] float64: the least and the largest value over the keys each row may see, per
    head-dim column, 0 among them with a sink (its value) or where the row sees no key. out is a convex
    combination of those values whatever the weights, so a result outside bounds it anyway: the check that
    stands where the weights are not determined (an ill-conditioned case, verdict.py)."""
    variant = variant or Variant.dense(causal)
    b, sq, h, _ = q.shape
    sk, hk, dv = k.shape[1], k.shape[2], v.shape[3]
    g = h // hk
    V = v.double().nan_to_num(nan=0.0).permute(0, 2, 1, 3).reshape(b, hk, 1, sk, dv)
    mask = _five(variant.mask, h, hk)
    lo = torch.zeros(b, hk, g, sq, dv, dtype=torch.float64, device=q.device)
    hi = torch.zeros_like(lo)
    cols = torch.arange(sk, device=q.device)
    offset = sk - sq if variant.offset is None else variant.offset
    chunk = max(1, _HULL_BUDGET // max(1, 16 * b * h * sk * dv))
    for i0 in range(0, sq if sk else 0, chunk):
        i1 = min(sq, i0 + chunk)
        seen = ~_hidden(variant, mask, i0, i1, cols, torch.arange(i0, i1, device=q.device)[:, None] + offset)
        seen = seen.expand(b, hk, g, i1 - i0, sk).unsqueeze(-1)
        values = V.unsqueeze(3)  # [b, hk, 1, 1, sk, dv]
        low = torch.where(seen, values, torch.inf).amin(-2)
        high = torch.where(seen, values, -torch.inf).amax(-2)
        none = ~seen.any(-2)
        lo[:, :, :, i0:i1] = torch.where(none, 0.0, low)
        hi[:, :, :, i0:i1] = torch.where(none, 0.0, high)
    if variant.sinks is not None:
        lo, hi = lo.clamp(max=0.0), hi.clamp(min=0.0)
    return tuple(t.reshape(b, h, sq, dv).permute(0, 2, 1, 3) for t in (lo, hi))


def _five(t: torch.Tensor | None, h: int, hk: int) -> torch.Tensor | None:
    """A mask or bias [B, H, SQ, SK] in the reference's [B, hk|1, g|1, SQ, SK] head grouping."""
    if t is None:
        return None
    B, H, SQ, SK = t.shape
    return t.reshape(B, hk, h // hk, SQ, SK) if H == h else t.reshape(B, 1, 1, SQ, SK)


def _rows(t: torch.Tensor, i0: int, i1: int) -> torch.Tensor:
    return t[:, :, :, i0:i1] if t.shape[3] > 1 else t


def _modded(mod: Callable, s: torch.Tensor, i0: int, i1: int, g: int) -> tuple:
    """A score_mod applied to the chunk's logits [b, hk, g, c, sk] on index grids, and its elementwise
    derivative (by autograd: a score_mod is elementwise)."""
    b, hk, _, c, sk = s.shape
    dev = s.device
    bi = torch.arange(b, device=dev).reshape(b, 1, 1, 1, 1)
    hi = (torch.arange(hk, device=dev)[:, None] * g + torch.arange(g, device=dev)).reshape(1, hk, g, 1, 1)
    ii = torch.arange(i0, i1, device=dev).reshape(1, 1, 1, c, 1)
    jj = torch.arange(sk, device=dev).reshape(1, 1, 1, 1, sk)
    with torch.enable_grad():
        pre = s.detach().requires_grad_(True)
        post = mod(pre, bi, hi, ii, jj).expand_as(pre)
        slope, = torch.autograd.grad(post, pre, torch.ones_like(post))
    return post.detach(), slope
