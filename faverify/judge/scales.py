"""The magnitude of the terms each output element sums, beside the FP64 reference (reference.py): the scale
the tolerance's floor is a multiple of (verdict.py)."""
from __future__ import annotations

import torch

from faverify.judge.verdict import FLUSHED

# A bias entry this large acts as a mask (exp of it is exactly 0 beside any other logit; a row of them only
# is uniform in fp32 as in FP64), not as a logit whose rounding costs precision: the logit bound leaves it out
MASK_LIKE = 1e30


class ScaleAccumulator:
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
    Apart from them, what rounding dS to the input dtype as a matmul operand costs below its smallest
    normal (operand_half_step = half a subnormal step): an absolute error per dS term whatever its size,
    carried through the matmul (dq_operand, dk_operand):
    dq_i  -> scale sum_j [P_ij > 0] half_step max|k_j|,   dk_j -> scale sum_i [P_ij > 0] half_step max|q_i|
    (softcap 94 at logits near 850: a slope of 6e-8 puts every dS a few fp16 subnormal steps from 0, and a
    correctly rounded dS gave dk 2.5x an allowance that counted relative roundings only.)
    max|x_j| over the head dim bounds every element's terms and keeps each one a matrix-vector product,
    cheap next to the reference itself. (The rms did not bound them: sdpa-cudnn's dq at a column where k
    was 1.3x its rms failed at 1.07x a floor it was within by this measure: constant logits, where the
    naive baseline's dq is exactly 0.)
    A rounding of each term costs about u times this, whatever cancellation makes of the sum.
    """

    def __init__(self, Q, K, V, dO, scale, slopes=None, sink=None, sq=0, operand_half_step=0.0):
        self.scale = scale
        self.half_step = operand_half_step
        self.v_max, self.k_max, self.q_max = _absmax(V), _absmax(K), _absmax(Q)  # [b, hk, 1|g, s]
        self.dO_max = _absmax(dO) if dO is not None else None
        zero = torch.zeros((), dtype=Q.dtype, device=Q.device)
        self.out = self.dq = zero
        # Cauchy-Schwarz bounds the sum of |q_d k_d| that a logit adds up (and cancels) in fp32
        self.logit = scale * Q.norm(dim=-1).amax() * K.norm(dim=-1).amax() if K.shape[3] else zero
        if slopes is not None and K.shape[3]:  # the bias a logit adds: slope times the largest distance
            self.logit = self.logit + slopes.abs().amax() * (max(sq, K.shape[3]) - 1)
        self.has_sink = sink is not None
        self.sink_max = sink.abs().amax() if sink is not None else zero
        self.dsinks = zero
        b, hk, g = Q.shape[:3]
        self.dv_cols = torch.zeros(b, hk, g, K.shape[3], dtype=Q.dtype, device=Q.device)
        self.dk_cols = torch.zeros_like(self.dv_cols)
        self.dk_operand_cols = torch.zeros_like(self.dv_cols)
        self.dq_operand = zero
        self.dbias_terms = None

    def add_logits(self, s):
        """A bias or score_mod moves the logits beyond the q.k bound: the largest seen bounds them then (an
        entry of MASK_LIKE size or more acts as a mask: exp of it is 0 beside any other logit)."""
        size = s.abs()
        size = torch.where(size < MASK_LIKE, size, torch.zeros_like(size))
        self.logit = torch.maximum(self.logit, size.amax())

    def add_dbias(self, shape, i0, i1, mag):
        """dbias sums dS over the bias's broadcast dimensions: the terms' magnitude summed likewise."""
        if self.dbias_terms is None:
            self.dbias_terms = torch.zeros(shape, dtype=mag.dtype, device=mag.device)
        add_rows(self.dbias_terms, mag, i0, i1)

    def add_forward(self, s, p):
        self.out = torch.maximum(self.out, (p * self.v_max.unsqueeze(-2)).sum(-1).amax())

    def add_backward(self, i0, i1, p, dp, D_terms, cap_slope=None, p_sink=None):
        self.dv_cols += (p * self.dO_max[:, :, :, i0:i1].unsqueeze(-1)).sum(-2)
        ds_mag = p * (dp.abs() + D_terms)
        if cap_slope is not None:  # softcap's derivative, <= 1, scales each dS term
            ds_mag = ds_mag * cap_slope
        if p_sink is not None:  # dsinks_h = -sum_i p_sink_i D_i: the sum of |terms| over a head's rows
            self.dsinks = torch.maximum(self.dsinks, (p_sink * D_terms).sum(dim=(0, 3, 4)).amax())
        self.dq = torch.maximum(self.dq, self.scale * (ds_mag * self.k_max.unsqueeze(-2)).sum(-1).amax())
        self.dk_cols += self.scale * (ds_mag * self.q_max[:, :, :, i0:i1].unsqueeze(-1)).sum(-2)
        if self.half_step > FLUSHED:  # fp16's 2^-25; bf16's and fp32's are far below what FLUSHED allows
            seen = (p > 0).to(p.dtype) * (self.scale * self.half_step)
            self.dq_operand = torch.maximum(self.dq_operand, (seen * self.k_max.unsqueeze(-2)).sum(-1).amax())
            self.dk_operand_cols += (seen * self.q_max[:, :, :, i0:i1].unsqueeze(-1)).sum(-2)

    def result(self, lse, backward):
        # the largest finite |lse| by a masked max, not by indexing with the mask: a boolean index waits for
        # the device to count the entries it keeps (a host sync a case)
        zero = torch.zeros_like(self.logit)
        lse_max = torch.where(torch.isfinite(lse), lse.abs(), zero).amax() if lse.numel() else zero
        scales = {"out": self.out, "lse": lse_max + self.logit + self.sink_max, "logit": self.logit}
        if backward:
            if self.has_sink:
                scales["dsinks"] = self.dsinks
            if self.dbias_terms is not None:
                scales["dbias"] = _amax0(self.dbias_terms)
            scales["dq"] = self.dq
            scales["dk"] = _amax0(self.dk_cols.sum(2))
            scales["dv"] = _amax0(self.dv_cols.sum(2))
            if self.half_step > FLUSHED:
                scales["dq_operand"] = self.dq_operand
                scales["dk_operand"] = _amax0(self.dk_operand_cols.sum(2))
        return scales


def _absmax(t):
    return t.abs().amax(-1)


def _amax0(t):
    return t.amax() if t.numel() else torch.zeros((), dtype=t.dtype, device=t.device)


def add_rows(dbias: torch.Tensor, ds: torch.Tensor, i0: int, i1: int) -> None:
    """dbias [B, H, SQ, SK] += the chunk's ds [b, hk, g, c, sk], summed over the dimensions the bias
    broadcasts over."""
    B, H, SQ, SK = dbias.shape
    b, hk, g, c, sk = ds.shape
    part = ds.reshape(b, hk * g, c, sk)
    if B == 1:
        part = part.sum(0, keepdim=True)
    if H == 1:
        part = part.sum(1, keepdim=True)
    if SQ == 1:
        dbias += part.sum(2, keepdim=True)
    else:
        dbias[:, :, i0:i1] += part
