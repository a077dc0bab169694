"""Draw a case's tensors from its seed: the value regime first, then the memory layout.

Values are drawn in the logical [batch, seqlen, nheads, headdim] shape with a torch.Generator on the
target device, so the same case gives the same values in every layout, and the same tensors every time
on one device. Layouts then place those values in memory the way real callers do.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from faverify.case import Case
from faverify.dtypes import TORCH

# Large-logit regime: q and k scaled by 32 give logits of standard deviation 32*32 = 1024 (at the default
# scale), so most exp(s - m) underflow to 0 and the max-logit gaps pass 1e3.
LARGE_SIGMA = 32.0
# A real NaN bug in a production kernel was triggered by every element equal to this bf16 value.
BF16_SCALE_VALUE = 133120.0
FP16_SCALE_VALUE = 32768.0  # 133120 overflows fp16; 2^15 is the same idea within range
OUTLIER_SIGMA, OUTLIER_RATE = 10.0, 0.001  # N(0,1) + N(0,100)*Bernoulli(0.001), as in the FA3 paper
TINY_SIGMA = 2.0**-10
PEAK_GAIN = 4.0  # dominant logit about PEAK_GAIN*sqrt(d) above the rest, about PEAK_GAIN*20 at d=32..256


@dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.q, self.k, self.v


def generator(seed: int, device: torch.device | str) -> torch.Generator:
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(seed)
    return g


def make_inputs(case: Case, device: torch.device | str, *, requires_grad: bool = False) -> Inputs:
    device = torch.device(device)
    dtype = TORCH[case.dtype]
    values = Inputs(*(t.to(dtype) for t in draw_values(case, device)))
    return lay_out(case, values, requires_grad=requires_grad)


def lay_out(case: Case, values: Inputs, *, requires_grad: bool = False) -> Inputs:
    """Logical-layout tensors of the case's dtype placed in memory per case.layout (also used for the
    stored inputs of golden files)."""
    q, k, v = _lay_out(case, values.q, values.k, values.v, requires_grad)
    dout = values.dout
    if case.layout == "transposed":
        dout = dout.transpose(1, 2).contiguous().transpose(1, 2)
    return Inputs(q, k, v, dout)


def draw_values(case: Case, device: torch.device) -> tuple[torch.Tensor, ...]:
    """q, k, v, dout in float32, logical layout, values per the case's regime."""
    g = generator(case.seed, device)
    b, sq, sk, h, hk, d = case.batch, case.seqlen_q, case.seqlen_k, case.nheads, case.nheads_k, case.head_dim

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32)

    q, k, v, dout = normal(b, sq, h, d), normal(b, sk, hk, d), normal(b, sk, hk, d), normal(b, sq, h, d)
    regime = case.regime
    if regime == "large":
        q, k = q * LARGE_SIGMA, k * LARGE_SIGMA
    elif regime == "bf16-scale":
        value = FP16_SCALE_VALUE if case.dtype == "fp16" else BF16_SCALE_VALUE
        q, k, v = (torch.full_like(t, value) for t in (q, k, v))
    elif regime == "outliers":
        q, k, v = (_with_outliers(t, g) for t in (q, k, v))
    elif regime == "constant":
        # every key equal: each query row sees equal logits, uniform attention over all its blocks
        k = k[:, :1].expand_as(k).contiguous()
    elif regime == "peaked":
        q = _peaked_queries(case, q, k, g)
    elif regime == "tiny":
        q, k, v, dout = (t * TINY_SIGMA for t in (q, k, v, dout))
    return q, k, v, dout


def _with_outliers(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    spikes = torch.randn(t.shape, generator=g, device=t.device) * OUTLIER_SIGMA
    hit = torch.rand(t.shape, generator=g, device=t.device) < OUTLIER_RATE
    return t + spikes * hit


def _peaked_queries(case: Case, q: torch.Tensor, k: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Point each query row at one key it can see, so one logit dominates the row."""
    b, sq, sk, h, d = case.batch, case.seqlen_q, case.seqlen_k, case.nheads, case.head_dim
    if sk == 0:
        return q
    rows = torch.arange(sq, device=q.device)
    limit = torch.full_like(rows, sk)  # keys visible to each row
    if case.causal:
        limit = (rows + sk - sq + 1).clamp(min=0, max=sk)
    pick = (torch.rand(b, sq, h, generator=g, device=q.device) * limit[None, :, None]).long()
    pick = torch.minimum(pick, (limit[None, :, None] - 1).clamp(min=0))
    kv_head = torch.arange(h, device=q.device) // case.group
    target = k[torch.arange(b, device=q.device)[:, None, None], pick, kv_head[None, None, :]]  # [b, sq, h, d]
    norm = target.norm(dim=-1, keepdim=True).clamp(min=1e-6)
    peaked = target / norm * (PEAK_GAIN * d**0.5) + 0.25 * q
    return torch.where((limit > 0)[None, :, None, None], peaked, q)


def _lay_out(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, requires_grad: bool):
    """Place q, k, v in memory per case.layout; with requires_grad the storage is the autograd leaf."""
    h, hk, d = case.nheads, case.nheads_k, case.head_dim
    layout = case.layout
    if layout == "contiguous":
        leaves = [t.contiguous() for t in (q, k, v)]
        for t in leaves:
            t.requires_grad_(requires_grad)
        return leaves
    if layout == "transposed":  # stored [b, h, s, d], seen through a transpose
        stores = [t.transpose(1, 2).contiguous().requires_grad_(requires_grad) for t in (q, k, v)]
        return [s.transpose(1, 2) for s in stores]
    if layout == "strided":
        # Row pitch wider than head_dim, the gap poisoned with NaN: a kernel that reads past the
        # head dim gets NaN, which the verdict cannot miss.
        out = []
        for t in (q, k, v):
            store = torch.full((*t.shape[:-1], d + 8), float("nan"), dtype=t.dtype, device=t.device)
            store[..., :d] = t
            store.requires_grad_(requires_grad)
            out.append(store[..., :d])
        return out
    # packed: one buffer, as a fused QKV projection produces it
    if case.seqlen_q == case.seqlen_k:
        store = torch.cat([q, k, v], dim=2).requires_grad_(requires_grad)  # [b, s, h + 2hk, d]
        return [store[:, :, :h], store[:, :, h:h + hk], store[:, :, h + hk:]]
    kv = torch.cat([k, v], dim=2).requires_grad_(requires_grad)  # q separate, kv packed [b, sk, 2hk, d]
    return [q.contiguous().requires_grad_(requires_grad), kv[:, :, :hk], kv[:, :, hk:]]
