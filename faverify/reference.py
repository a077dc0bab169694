"""Attention forward and backward by explicit formulas, chunked over query rows.

One implementation serves two purposes:
- the FP64 reference (compute in float64, nothing rounded), the truth every subject is judged against;
- the naive baseline (baseline.py): the same formulas computed in float32 and rounded to the case's
  dtype after every operation, as `softmax(q @ k.T * scale) @ v` written in that dtype does it.

Memory is O(chunk * seqlen_k): the chunk of query rows is sized from a byte budget, and dk/dv are
accumulated across chunks. Conventions (docs/design.md): layout [b, s, h, d], k/v heads shared by groups of
h // h_k query heads, causal aligned bottom-right, a row that sees no key gives out 0, lse -inf, dq 0.
"""
from __future__ import annotations

from typing import Callable

import torch

Tensors = dict  # name -> tensor: out [b,sq,h,d], lse [b,h,sq], dq [b,sq,h,d], dk/dv [b,sk,hk,d]
TENSORS = ("out", "lse", "dq", "dk", "dv")

_CHUNK_BUDGET = {"cpu": 64 << 20, "cuda": 1 << 30}  # bytes for one chunk's [rows x seqlen_k] temporaries
_TEMPORARIES = 6  # s, p, dp, ds and two products alive at once


def bytes_needed(b: int, sq: int, sk: int, h: int, hk: int, d: int, elem: int, device: str, backward: bool) -> int:
    """About how much memory one case takes on its device: the inputs and the subject's outputs in their
    dtype (a few copies), the reference's FP64 tensors (q, dO, out, dq over sq; k, v over sk; dk and dv per
    query head), and one chunk of the [rows x seqlen_k] temporaries (at least one row). The naive baseline
    works in fp32 over the same shapes, within this."""
    rows_q, rows_k = b * sq * h * d, b * sk * hk * d
    dtype_side = elem * 4 * (2 * rows_q + 2 * rows_k)  # inputs, pristine copies, outputs, gradients
    fp64 = 8 * ((4 if backward else 2) * rows_q + 2 * rows_k + (2 * b * sk * h * d if backward else 0))
    chunk = max(_CHUNK_BUDGET["cuda" if device == "cuda" else "cpu"], _TEMPORARIES * b * h * sk * 8)
    return dtype_side + fp64 + chunk


def reference(q, k, v, dout=None, *, causal: bool, scale: float) -> tuple[Tensors, dict]:
    """FP64 outputs (and gradients when dout is given), plus the magnitude scale of each tensor.

    A scale is the size of the terms summed to produce a tensor (see _ScaleAccumulator), not the size of
    the result: dk is exactly zero when seqlen_k == 1, but the terms that cancelled to give that zero are
    not, and rounding them costs a kernel about u times their size.
    """
    return _attention(q, k, v, dout, causal=causal, scale=scale, compute=torch.float64, round_to=None,
                      with_scales=True)


def naive(q, k, v, dout=None, *, causal: bool, scale: float) -> Tensors:
    """The same formulas in the inputs' dtype: fp32 arithmetic, rounded to q.dtype after every op."""
    tensors, _ = _attention(q, k, v, dout, causal=causal, scale=scale, compute=torch.float32,
                            round_to=q.dtype, with_scales=False)
    return tensors


def _attention(q, k, v, dout, *, causal, scale, compute, round_to, with_scales):
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    g = h // hk
    dev = q.device
    rnd: Callable = (lambda t: t.to(round_to).to(compute)) if round_to is not None else (lambda t: t)
    backward = dout is not None

    def heads(t, n):  # [b, s, n, d] -> [b, hk, n // hk, s, d], query head i reads kv head i // g
        return t.to(compute).permute(0, 2, 1, 3).reshape(b, hk, n // hk, t.shape[1], d)

    Q, K, V = heads(q, h), heads(k, hk), heads(v, hk)  # K, V: [b, hk, 1, sk, d]
    dO = heads(dout, h) if backward else None
    out = torch.zeros(b, hk, g, sq, d, dtype=compute, device=dev)
    lse = torch.full((b, hk, g, sq), float("-inf"), dtype=compute, device=dev)
    dq = torch.zeros_like(out) if backward else None
    dk_heads = torch.zeros(b, hk, g, sk, d, dtype=compute, device=dev) if backward else None
    dv_heads = torch.zeros_like(dk_heads) if backward else None
    acc = _ScaleAccumulator(Q, K, V, dO, scale) if with_scales else None

    if sk > 0:
        budget = _CHUNK_BUDGET.get(dev.type, _CHUNK_BUDGET["cuda"])
        chunk = max(1, budget // (_TEMPORARIES * b * h * sk * torch.finfo(compute).bits // 8))
        cols = torch.arange(sk, device=dev)
        for i0 in range(0, sq, chunk):
            i1 = min(sq, i0 + chunk)
            Qc = Q[:, :, :, i0:i1]
            s = rnd(rnd(Qc @ K.transpose(-1, -2)) * scale)  # [b, hk, g, c, sk]
            if causal:
                rows = torch.arange(i0, i1, device=dev)
                s = s.masked_fill(cols[None, :] > rows[:, None] + (sk - sq), float("-inf"))
            m = s.amax(dim=-1, keepdim=True)
            m = torch.where(m == float("-inf"), torch.zeros_like(m), m)  # guard: never (-inf) - (-inf)
            p = torch.exp(s - m)
            l = p.sum(dim=-1, keepdim=True)
            seen = l > 0
            lse[:, :, :, i0:i1] = torch.where(seen, m + torch.log(l), float("-inf")).squeeze(-1)
            p = rnd(torch.where(seen, p / torch.where(seen, l, torch.ones_like(l)), torch.zeros_like(p)))
            o = rnd(p @ V)
            out[:, :, :, i0:i1] = o
            if acc is not None:
                acc.add_forward(s, p)
            if not backward:
                continue
            dOc = dO[:, :, :, i0:i1]
            dp = rnd(dOc @ V.transpose(-1, -2))
            if round_to is None:
                D = (dOc * o).sum(dim=-1, keepdim=True)  # rowsum(dO * O) == rowsum(dP * P) exactly
            else:
                D = (dp * p).sum(dim=-1, keepdim=True)  # what torch's softmax backward computes
            ds = rnd(rnd(p * (dp - D)) * scale)
            dq[:, :, :, i0:i1] = rnd(ds @ K)
            dk_heads += ds.transpose(-1, -2) @ Qc
            dv_heads += p.transpose(-1, -2) @ dOc
            if acc is not None:
                acc.add_backward(i0, i1, p, dp, (dOc * o).abs().sum(dim=-1, keepdim=True))

    tensors = {
        "out": rnd(out).reshape(b, h, sq, d).permute(0, 2, 1, 3),
        "lse": rnd(lse).reshape(b, h, sq),
    }
    if backward:
        # a naive GQA user expands k/v per head; autograd sums the per-head gradients in the dtype
        tensors["dq"] = dq.reshape(b, h, sq, d).permute(0, 2, 1, 3)
        tensors["dk"] = rnd(rnd(dk_heads).sum(dim=2)).permute(0, 2, 1, 3)
        tensors["dv"] = rnd(rnd(dv_heads).sum(dim=2)).permute(0, 2, 1, 3)
    scales = acc.result(tensors["lse"], backward) if acc is not None else {}
    if round_to is not None:  # already rounded: the cast is exact
        tensors = {name: t.to(round_to) for name, t in tensors.items()}
    return tensors, scales


class _ScaleAccumulator:
    """The magnitude of the terms summed into each output element, max over the tensor.

    out_i = sum_j P_ij v_j                       -> sum_j P_ij max|v_j|
    dv_j  = sum_i P_ij dO_i                      -> sum_i P_ij max|dO_i|
    dS_ij = P_ij (dP_ij - D_i)                   -> P_ij (|dP_ij| + sum_d |dO_id O_id|)
            (the two terms that cancel; D = sum_d dO_id O_id is formed from O rounded to the input dtype,
            so its error follows the sum of |terms|, not |D|, which may itself cancel)
    dq_i  = scale sum_j dS_ij k_j                -> scale sum_j |dS|_ij max|k_j|
    dk_j  = scale sum_i dS_ij q_i                -> scale sum_i |dS|_ij max|q_i|
    s_ij  = scale sum_d q_id k_jd                -> scale max||q_i|| max||k_j||  (>= scale sum_d |q_id k_jd|)
    lse_i = m_i + log sum_j exp(s_ij - m_i)      -> the logit scale above + max |lse_i|
    max|x_j| over the head dim bounds every element's terms and keeps each one a matrix-vector product,
    cheap next to the reference itself. (The rms did not bound them: sdpa-cudnn's dq at a column where k
    was 1.3x its rms failed at 1.07x a floor it was within by this measure: constant logits, where the
    naive baseline's dq is exactly 0.)
    A rounding of each term costs about u times this, whatever cancellation makes of the sum.
    """

    def __init__(self, Q, K, V, dO, scale):
        self.scale = scale
        self.v_max, self.k_max, self.q_max = _absmax(V), _absmax(K), _absmax(Q)  # [b, hk, 1|g, s]
        self.dO_max = _absmax(dO) if dO is not None else None
        zero = torch.zeros((), dtype=Q.dtype, device=Q.device)
        self.out = self.dq = zero
        # Cauchy-Schwarz bounds the sum of |q_d k_d| that a logit adds up (and cancels) in fp32
        self.logit = scale * Q.norm(dim=-1).amax() * K.norm(dim=-1).amax() if K.shape[3] else zero
        b, hk, g = Q.shape[:3]
        self.dv_cols = torch.zeros(b, hk, g, K.shape[3], dtype=Q.dtype, device=Q.device)
        self.dk_cols = torch.zeros_like(self.dv_cols)

    def add_forward(self, s, p):
        self.out = torch.maximum(self.out, (p * self.v_max.unsqueeze(-2)).sum(-1).amax())

    def add_backward(self, i0, i1, p, dp, D_terms):
        self.dv_cols += (p * self.dO_max[:, :, :, i0:i1].unsqueeze(-1)).sum(-2)
        ds_mag = p * (dp.abs() + D_terms)
        self.dq = torch.maximum(self.dq, self.scale * (ds_mag * self.k_max.unsqueeze(-2)).sum(-1).amax())
        self.dk_cols += self.scale * (ds_mag * self.q_max[:, :, :, i0:i1].unsqueeze(-1)).sum(-2)

    def result(self, lse, backward):
        finite = lse[torch.isfinite(lse)]
        lse_max = finite.abs().amax() if finite.numel() else torch.zeros_like(self.logit)
        scales = {"out": self.out, "lse": lse_max + self.logit, "logit": self.logit}
        if backward:
            scales["dq"] = self.dq
            scales["dk"] = _amax0(self.dk_cols.sum(2))
            scales["dv"] = _amax0(self.dv_cols.sum(2))
        return scales


def _absmax(t):
    return t.abs().amax(-1)


def _amax0(t):
    return t.amax() if t.numel() else torch.zeros((), dtype=t.dtype, device=t.device)
