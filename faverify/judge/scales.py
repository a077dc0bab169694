"""The magnitude of the terms each output element sums, beside the FP64 reference (reference.py): the scale
the tolerance's floor is a multiple of (verdict.py)."""
from __future__ import annotations

import torch

from faverify.judge.flash_bound import FP32_DOT, MASK_LIKE, Dot, FlashBound


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
    Beside them, what the flash algorithm's own roundings cost absolutely (flash_bound.FlashBound): {tensor}_flash.
    max|x_j| over the head dim bounds every element's terms and keeps each one a matrix-vector product,
    cheap next to the reference itself. (The rms did not bound them: sdpa-cudnn's dq at a column where k
    was 1.3x its rms failed at 1.07x a floor it was within by this measure: constant logits, where the
    naive baseline's dq is exactly 0.)
    A rounding of each term costs about u times this, whatever cancellation makes of the sum.
    """

    def __init__(self, Q, K, V, dO, scale, slopes=None, sink=None, sq=0, operand_half_step=0.0,
                 dot: Dot = FP32_DOT, weight_unit: float = 0.0):
        self.scale = scale
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
        self.dbias_terms = self.dbias_flash = None
        self.flash = FlashBound(Q, K, scale, self, operand_half_step, dot, weight_unit)

    def add_logits(self, s):
        """A bias or score_mod moves the logits beyond the q.k bound: the largest seen bounds them then (an
        entry of MASK_LIKE size or more acts as a mask: exp of it is 0 beside any other logit)."""
        size = s.abs()
        size = torch.where(size < MASK_LIKE, size, torch.zeros_like(size))
        self.logit = torch.maximum(self.logit, size.amax())

    def add_dbias(self, shape, i0, i1, mag):
        """dbias sums dS over the bias's broadcast dimensions: the terms' magnitude summed likewise, and what
        the flash algorithm's weights move them by."""
        if self.dbias_terms is None:
            self.dbias_terms = torch.zeros(shape, dtype=mag.dtype, device=mag.device)
            self.dbias_flash = torch.zeros_like(self.dbias_terms)
        add_rows(self.dbias_terms, mag, i0, i1)
        add_rows(self.dbias_flash, mag * self.flash.delta, i0, i1)

    def add_forward(self, i0, i1, s, p, m, lse, slope=None, multiplicity=None):
        """Rows i0..i1: their logits s (hidden keys -inf), weights p, row max m, lse and the slope of the cap
        or score_mod on each logit (flash_bound's)."""
        self.out = torch.maximum(self.out, (p * self.v_max.unsqueeze(-2)).sum(-1).amax())
        self.flash.add_forward(i0, i1, s, p, m, lse, slope, multiplicity)

    def add_backward(self, i0, i1, p, dp, D_terms, slope=None, p_sink=None, capped=False):
        self.dv_cols += (p * self.dO_max[:, :, :, i0:i1].unsqueeze(-1)).sum(-2)
        ds_mag = p * (dp.abs() + D_terms)
        if slope is not None:  # softcap's derivative (<= 1) or a score_mod's scales each dS term
            ds_mag = ds_mag * slope
        if p_sink is not None:  # dsinks_h = -sum_i p_sink_i D_i: the sum of |terms| over a head's rows
            self.dsinks = torch.maximum(self.dsinks, (p_sink * D_terms).sum(dim=(0, 3, 4)).amax())
        self.dq = torch.maximum(self.dq, self.scale * (ds_mag * self.k_max.unsqueeze(-2)).sum(-1).amax())
        self.dk_cols += self.scale * (ds_mag * self.q_max[:, :, :, i0:i1].unsqueeze(-1)).sum(-2)
        self.flash.add_backward(i0, i1, p, dp, D_terms, slope, capped, p_sink)

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
                scales["dbias_flash"] = _amax0(self.dbias_flash)
            scales["dq"] = self.dq
            scales["dk"] = _amax0(self.dk_cols.sum(2))
            scales["dv"] = _amax0(self.dv_cols.sum(2))
        scales.update(self.flash.result(backward, self.has_sink))
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
