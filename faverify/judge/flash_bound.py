"""What the flash algorithm's own roundings may cost, element by element, beside the FP64 reference: the
absolute term of the tolerance that no naive baseline measures (verdict.py, docs/design.md "Tolerance").

A flash kernel does not compute the naive attention. Its forward keeps the logits in fp32, in log2 units, and
stores lse in fp32; its backward recomputes S in its own summation order and forms P = exp2(x - lse log2 e)
from that stored lse. The exponent is then a difference of two rounded numbers of the logits' size, not the
exact s - m of the naive softmax, and the weights move by that difference, relatively:

    delta_i = u32 (rounds_dot * L_i + rounds_row * M_i + rescales * R_i)

- L_i = scale ||q_i|| max_j ||k_j|| bounds the sum of |q_d k_d| a logit of row i adds up (Cauchy-Schwarz), times
  the softcap's slope where the logit is capped (a capped logit moves by its slope times S's error);
  rounds_dot = 1 + ceil(d / 16) roundings of that size: one per step of 16 products an MMA chain
  accumulates in fp32, and the last. The backward's S and the forward's differ by both dots' errors.
  FP8 inputs (Dot.fp8): Hopper's FP8 tensor cores keep about 14 bits of the accumulator (DeepSeek-V3's
  report), so S errs by 2^-13 of L_i per step of 32 products. The bundled FP8 forward's errors in the
  large regime on the H100 (out 0.22 where the FP8 baseline errs by 0.022, logits near 6000) are what an
  emulation that truncates S to 13-14 bits gives; one that keeps 16 bits or more gives the baseline's.
- M_i = max(|m_i|, |lse_i|), the size of the row's logits near its max: each of x = s log2 e, m + log2 l,
  lse to the natural log and back, and the exponent's difference rounds once at that size. rounds_row
  counts them: 2 for out (x, x - m), 3 for lse (+ m + log2 l), 6 for the backward (x in the forward and
  again in the backward, m + log2 l, lse's two conversions, x - lse).
- R_i, the times the online softmax's running max rises (at most the records of the row's logits, in the
  order its keys are visited: _rises): each rescales acc and l, a relative rounding of each that does not
  cancel in acc / l. Twice for out and the backward (acc, l), once for lse (l).

Then each tensor's term is its terms' magnitudes times their weights' delta (out_i: delta_i sum_j P_ij |v_j|;
dv_j: sum_i P_ij delta_i |dO_i|; dq, dk through dS_ij = P_ij (dP_ij - D_i)), plus what the backward's other
roundings cost that no relative floor bounds:
- softcap's derivative as 1 - tanh^2 from an fp32 tanh errs by up to SLOPE_ERROR absolutely (2 t dt with
  tanh's two ulps, and t^2's rounding), however small sech^2 is: at a saturated tanh it is all rounding;
- dS rounded to the input dtype as a matmul operand: below the smallest normal that rounding is absolute,
  half a subnormal step per term (fp16's 2^-25; bf16's and fp32's are below FLUSHED).
A row whose logits are a mask-like bias (MASK_LIKE) is uniform in fp32 as in FP64: it adds no M.

A sparse key listed n times weighs n exp(s) = exp(s + log n). A kernel may take that weight as an additive
bias in its inputs' dtype (torch's SDPA takes no other), rounded there: each weight then moves by up to half
that dtype's unit times log n, W_i the row's largest log n. A kernel that weighs a duplicate once, or not at
all, errs by log 2 or more, which this term never covers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from faverify.judge.verdict import FLUSHED

U32 = 2.0**-24


@dataclass(frozen=True)
class Dot:
    """How a kernel's logits are summed: the relative rounding of one accumulation step, and the products a
    step adds (an MMA instruction's k)."""
    unit: float = U32
    step: int = 16

    def rounds(self, head_dim: int) -> int:
        """The roundings of S's size a dot of head_dim products makes: one a step, and the last."""
        return 1 + -(-head_dim // self.step)


FP32_DOT = Dot()
FP8_DOT = Dot(unit=2.0**-13, step=32)
MASK_LIKE = 1e30  # a bias entry this large acts as a mask (scales.py leaves it out of the logit bound too)
ROUNDS_ROW = {"out": 2, "lse": 3, "logit": 1, "backward": 6}
SLOPE_ERROR = 5 * U32


class FlashBound:
    """The flash algorithm's absolute error terms, accumulated chunk of rows by chunk of rows as the
    reference computes them (reference._rows_of), max over each tensor. maxima: the ScaleAccumulator whose
    per-row and per-key max|x| it reads."""

    def __init__(self, Q, K, scale: float, maxima, half_step: float, dot: Dot = FP32_DOT, weight_unit: float = 0.0):
        self.maxima, self.scale, self.weight_unit = maxima, scale, weight_unit
        self.dot = dot.rounds(Q.shape[-1]) * dot.unit / U32  # the dot's error in units of u32
        self.unit = dot.unit
        self.q_norm = Q.norm(dim=-1)  # [b, hk, g, sq]
        self.k_norm = K.norm(dim=-1)  # [b, hk, 1, sk]
        self.half_step = half_step if half_step > FLUSHED else 0.0
        zero = torch.zeros((), dtype=Q.dtype, device=Q.device)
        self.out = self.lse = self.logit = self.dq = self.dsinks = zero
        self.dv_cols = torch.zeros(Q.shape[0], Q.shape[1], Q.shape[2], K.shape[3], dtype=Q.dtype, device=Q.device)
        self.dk_cols = torch.zeros_like(self.dv_cols)
        self.delta = None  # the current chunk's backward delta_i [b, hk, g, c, 1]

    def add_forward(self, i0: int, i1: int, s, p, m, lse, cap_slope=None, multiplicity=None) -> None:
        """Rows i0..i1: s the logits (hidden keys -inf), p the weights, m the row max (0 where none), lse
        [b, hk, g, c]; cap_slope softcap's sech^2 where it caps; multiplicity the keys' log n."""
        L, M = self._sizes(i0, i1, s, m, lse, cap_slope)
        R = _rises(s)
        W = 0.0 if multiplicity is None else self.weight_unit * multiplicity.abs().amax(-1, keepdim=True)

        def row(dots, rows, rescales):  # a row's delta: its dots', its own and its rescales' roundings
            return U32 * (dots * L + rows * M + rescales * R) + W
        has = torch.isfinite(lse).unsqueeze(-1)
        weights = (p * self.maxima.v_max.unsqueeze(-2)).sum(-1, keepdim=True)
        self.out = torch.maximum(self.out, (row(self.dot, ROUNDS_ROW["out"], 2) * weights).amax())
        self.lse = torch.maximum(self.lse, torch.where(has, row(self.dot, ROUNDS_ROW["lse"], 1), 0.0).amax())
        self.logit = torch.maximum(self.logit, torch.where(has, row(self.dot, ROUNDS_ROW["logit"], 0), 0.0).amax())
        self.delta = row(2 * self.dot, ROUNDS_ROW["backward"], 2)

    def _sizes(self, i0: int, i1: int, s, m, lse, cap_slope) -> tuple:
        """(L, M) of rows i0..i1, [b, hk, g, c, 1]: the module docstring's."""
        seen = torch.isfinite(s)
        k_norm = self.k_norm.unsqueeze(-2).expand_as(s)
        if cap_slope is not None:
            k_norm = k_norm * cap_slope
        k_top = torch.where(seen, k_norm, torch.zeros_like(k_norm)).amax(-1, keepdim=True) if s.shape[-1] else \
            torch.zeros_like(m)
        L = self.scale * self.q_norm[:, :, :, i0:i1].unsqueeze(-1) * k_top
        size = torch.maximum(m.abs(), torch.where(torch.isfinite(lse), lse.abs(), 0.0).unsqueeze(-1))
        return L, torch.where(size < MASK_LIKE, size, torch.zeros_like(size))

    def add_backward(self, i0: int, i1: int, p, dp, D_terms, slope=None, capped: bool = False, p_sink=None) -> None:
        """The chunk's share of dv, dq, dk and dsinks (the arguments as ScaleAccumulator.add_backward's)."""
        mx, delta = self.maxima, self.delta
        self.dv_cols += (p * (delta * mx.dO_max[:, :, :, i0:i1].unsqueeze(-1))).sum(-2)
        terms = p * (dp.abs() + D_terms)
        moved = delta * slope if slope is not None else delta
        ds = terms * (moved + SLOPE_ERROR) if capped else terms * moved
        if self.half_step:
            ds = ds + (p > 0).to(p.dtype) * self.half_step
        self.dq = torch.maximum(self.dq, self.scale * (ds * mx.k_max.unsqueeze(-2)).sum(-1).amax())
        self.dk_cols += self.scale * (ds * mx.q_max[:, :, :, i0:i1].unsqueeze(-1)).sum(-2)
        if p_sink is not None:
            self.dsinks = torch.maximum(self.dsinks, (p_sink * delta * D_terms).sum(dim=(0, 3, 4)).amax())

    def result(self, backward: bool, has_sink: bool) -> dict:
        """{tensor}_flash for each tensor the reference gives, and the unit of the logits' sum (logit_unit:
        the verdict's ill-conditioning follows it)."""
        terms = {"out": self.out, "lse": self.lse, "max_logit": self.logit}
        if backward:
            terms.update(dq=self.dq, dk=_amax0(self.dk_cols.sum(2)), dv=_amax0(self.dv_cols.sum(2)))
            if has_sink:
                terms["dsinks"] = self.dsinks
        unit = torch.full((), self.unit, dtype=self.out.dtype, device=self.out.device)
        return {"logit_unit": unit, **{f"{name}_flash": t for name, t in terms.items()}}


def _rises(s) -> torch.Tensor:
    """How many times a row's running max rises as an online softmax visits its keys, [b, hk, g, c, 1]: at
    most the records of its logits in the order visited, left to right or right to left, whatever the
    blocks (a block's records rise once)."""
    if not s.shape[-1]:
        return torch.zeros_like(s[..., :1])

    def records(t):
        before = torch.cat([torch.full_like(t[..., :1], -torch.inf), t.cummax(-1).values[..., :-1]], -1)
        return (t > before).sum(-1, keepdim=True).to(t.dtype)
    return torch.maximum(records(s), records(s.flip(-1)))


def _amax0(t):
    return t.amax() if t.numel() else torch.zeros((), dtype=t.dtype, device=t.device)
