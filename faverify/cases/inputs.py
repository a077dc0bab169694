"""Draw a case's tensors from its seed: the value regime first, then the memory layout.

Values are drawn in the logical [batch, seqlen, nheads, headdim] shape with a torch.Generator on the
target device, so the same case gives the same values in every layout, and the same tensors every time
on one device. Layouts then place those values in memory the way real callers do.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from faverify.cases import fp8, masks, ragged
from faverify.cases.case import Case
from faverify.cases.conventions import DEFAULT as DEFAULT_CONVENTIONS
from faverify.cases.conventions import Conventions
from faverify.cases.margins import margined
from faverify.cases.variant import Variant
from faverify.cases.vocabulary import MAX_SEED
from faverify.dtypes import TORCH

# Large-logit regime: q and k scaled by 32 give logits of standard deviation 32*32 = 1024 (at the default
# scale), so most exp(s - m) underflow to 0 and the max-logit gaps pass 1e3.
LARGE_SIGMA = 32.0
# A real NaN bug in a production kernel was triggered by every element equal to this bf16 value.
BF16_SCALE_VALUE = 133120.0
FP16_SCALE_VALUE = 32768.0  # 133120 overflows fp16; 2^15 is the same idea within range
OUTLIER_SIGMA, OUTLIER_RATE = 10.0, 0.001  # N(0,1) + N(0,100)*Bernoulli(0.001), as in the FA3 paper
TINY_SIGMA = 2.0**-10
DLSE_STREAM = 0x5EED  # dlse's seed, offset from the case's
PEAK_GAIN = 4.0  # dominant logit about PEAK_GAIN*sqrt(d) above the rest, about PEAK_GAIN*20 at d=32..256
# "negative": the row maxima drawn, past exp's fp32 range (-88.7, where exp(lse) underflows), FlashInfer's
# finite -inf sentinel (-5e4) and beyond
NEGATIVE_MAXIMA = (-1e2, -1e3, -6e4, -1e6)
KEY_SHIFT = 8.0  # every key gets this many units along one direction u, so q = -c u scores all of them < 0
LONE_KEY_SCORE = -5e5  # "lone-key": the one key a row sees scores this
FP16_LIMIT = 6e4  # the extreme regimes clamp fp16 values below its largest finite value (65504)


@dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    alibi_slopes: torch.Tensor | None = None  # fp32 [h] or [b, h]
    sinks: torch.Tensor | None = None  # fp32 [h]; a leaf that requires grad when the case runs backward
    fixed_sinks: bool = False  # the sinks are a fixed logit (the off-by-one sink): never a gradient's leaf
    # ragged cases (ragged.py): varlen offsets int32 [batch + 1]; paged block table and cache lengths, and
    # the keys and values each sequence must read ([batch, max cache, hk, d]: the reference's, never passed)
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    block_table: torch.Tensor | None = None
    cache_seqlens: torch.Tensor | None = None
    k_logical: torch.Tensor | None = None
    v_logical: torch.Tensor | None = None
    # masks and biases (masks.py): the keep-mask as a function and as a bool [B, H, SQ, SK] tensor, a
    # "block" pattern's blocks, the additive bias (a leaf that requires grad when the case asks dbias), and
    # a score_mod
    mask_mod: object = None
    attn_mask: torch.Tensor | None = None
    block_mask: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    score_mod: object = None
    # FP8 cases (fp8.py): q, k, v above are e4m3; these fp32 [batch, nheads_k] factors give their values
    q_descale: torch.Tensor | None = None
    k_descale: torch.Tensor | None = None
    v_descale: torch.Tensor | None = None
    # a loss on lse (Case.lse_grad): its gradient, fp32 [b, h, sq] in the natural log's units
    dlse: torch.Tensor | None = None

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.q, self.k, self.v

    def extras(self) -> dict:
        """The variant and ragged tensors the case uses, by their keyword (flash-attn's names)."""
        return {name: getattr(self, name) for name in EXTRAS if getattr(self, name) is not None}

    def copy(self, *, requires_grad: bool = False, dout: bool = True) -> "Inputs":
        """Fresh copies of every tensor, q, k, v inside new NaN margins (the leaves with requires_grad),
        the sinks a leaf too: the same inputs again, for a rerun or a pristine yardstick."""
        def leaf(t):
            return margined(t.detach(), requires_grad, token_dims=t.dim() - 2) if requires_grad else t.detach().clone()
        fields = {name: (t.detach().clone() if isinstance(t, torch.Tensor) else t)
                  for name, t in vars(self).items()}
        fields.update(q=leaf(self.q), k=leaf(self.k), v=leaf(self.v))
        if not dout:
            fields["dout"] = self.dout
        if self.sinks is not None:
            fields["sinks"] = self.sinks.detach().clone().requires_grad_(requires_grad and not self.fixed_sinks)
        if self.bias is not None:
            fields["bias"] = self.bias.detach().clone().requires_grad_(requires_grad and self.bias.requires_grad)
        return Inputs(**fields)

    def differentiable(self) -> dict:
        """What gradients are taken with respect to, by the gradient's name: q, k, v, and the sinks and the
        bias when the case asks for theirs."""
        named = dict(zip(("dq", "dk", "dv"), self.tensors()))
        if self.sinks is not None and not self.fixed_sinks:
            named["dsinks"] = self.sinks
        if self.bias is not None and self.bias.requires_grad:
            named["dbias"] = self.bias
        return named


# the keywords of Inputs.extras, flash-attn's names, then the masks' (subjects.base.variant_keywords picks
# the form of a mask each subject takes)
EXTRAS = ("alibi_slopes", "sinks", "cu_seqlens_q", "cu_seqlens_k", "block_table", "cache_seqlens", "mask_mod",
          "attn_mask", "block_mask", "bias", "score_mod", "q_descale", "k_descale", "v_descale")


def variant_of(case: Case, x: Inputs, conventions: Conventions = DEFAULT_CONVENTIONS) -> Variant:
    """What the reference adds to dense attention for this case and its inputs, under the conventions."""
    left, right = case.bounds
    return Variant(left=left, right=right, softcap=case.softcap, alibi_slopes=x.alibi_slopes,
                   sinks=None if x.sinks is None else x.sinks.detach(), sinks_learned=not x.fixed_sinks,
                   offset=conventions.offset(case.seqlen_q, case.seqlen_k), alibi_form=conventions.alibi,
                   mask=x.attn_mask, bias=None if x.bias is None else x.bias.detach(), score_mod=x.score_mod)


def generator(seed: int, device: torch.device | str) -> torch.Generator:
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(seed)
    return g


def make_inputs(case: Case, device: torch.device | str, *, requires_grad: bool = False) -> Inputs:
    device = torch.device(device)
    dtype = TORCH[case.dtype]
    drawn = draw_values(case, device)
    values = Inputs(*(t.to(dtype) for t in drawn[:4]), *drawn[4:])
    if case.fp8 != "off":  # q, k, v in e4m3 with their descales; dO in the output's dtype
        (values.q, values.q_descale), (values.k, values.k_descale), (values.v, values.v_descale) = (
            fp8.quantize(case, t, case.nheads_k) for t in drawn[:3])
    if case.mask != "off" or case.bias != "off" or case.score_mod != "off":
        values = _with_masks(case, values, device)
    return lay_out(case, values, requires_grad=requires_grad)


def _with_masks(case: Case, values: Inputs, device: torch.device) -> Inputs:
    """The case's mask, bias and score_mod (masks.draw); with mask_nan, NaN in k and v at every key that
    no row may see, which a kernel must not let into any output."""
    drawn = masks.draw(case, device)
    if case.mask_nan:
        dead = masks.dead_keys(case, drawn["attn_mask"])[..., None]  # [b, sk, hk, 1]
        values.k = torch.where(dead, torch.full_like(values.k, float("nan")), values.k)
        values.v = torch.where(dead, torch.full_like(values.v, float("nan")), values.v)
    for name, value in drawn.items():
        setattr(values, name, value)
    return values


def lay_out(case: Case, values: Inputs, *, requires_grad: bool = False) -> Inputs:
    """Logical-layout tensors of the case's dtype placed in memory per case.layout (also used for the
    stored inputs of golden files)."""
    if case.kind != "dense":
        return _lay_out_ragged(case, values, requires_grad)
    q, k, v = _lay_out(case, values.q, values.k, values.v, requires_grad)
    dout = values.dout
    if case.layout == "transposed":  # dO from a transpose as well, as callers' gradients often are
        dout = dout.transpose(1, 2).contiguous().transpose(1, 2)
    sinks = _sinks_leaf(case, values.sinks, requires_grad)
    bias = values.bias
    if bias is not None:
        bias = bias.detach().clone().requires_grad_(requires_grad and case.bias_grad)
    dlse = values.dlse if values.dlse is not None or case.lse_grad == "off" else _dlse(case, q.device)
    if case.lse_grad == "alone":  # the loss on lse alone: no gradient reaches out
        dout = torch.zeros_like(dout)
    return Inputs(q, k, v, dout, values.alibi_slopes, sinks, case.sinks == "zero", mask_mod=values.mask_mod,
                  attn_mask=values.attn_mask, block_mask=values.block_mask, bias=bias, score_mod=values.score_mod,
                  q_descale=values.q_descale, k_descale=values.k_descale, v_descale=values.v_descale, dlse=dlse)


def _dlse(case: Case, device: torch.device) -> torch.Tensor:
    """The loss's gradient on lse, N(0, 1) per row, drawn on the CPU from a stream of its own (the other
    inputs are drawn as they were, and a golden file's stored inputs get the same dlse on any device)."""
    g = generator((case.seed + DLSE_STREAM) % MAX_SEED, "cpu")
    return torch.randn(case.batch, case.nheads, case.seqlen_q, generator=g).to(device)



def _lay_out_ragged(case: Case, values: Inputs, requires_grad: bool) -> Inputs:
    """Pack or page a padded draw; inputs already packed or paged (a rerun's) are copied afresh."""
    if values.cu_seqlens_q is not None or values.block_table is not None:
        return values.copy(requires_grad=requires_grad)
    sinks = _sinks_leaf(case, values.sinks, requires_grad)
    if case.kind == "varlen":
        parts = ragged.pack(case, values.q, values.k, values.v, values.dout, requires_grad)
    else:  # paged: q as a dense batch; no gradients are asked of it (decode kernels are forward-only)
        parts = dict(q=margined(values.q, requires_grad), dout=values.dout, **ragged.page(case, values.k, values.v))
    return Inputs(alibi_slopes=values.alibi_slopes, sinks=sinks, fixed_sinks=case.sinks == "zero", **parts)


def _sinks_leaf(case: Case, sinks: torch.Tensor | None, requires_grad: bool) -> torch.Tensor | None:
    """A fresh copy of the sinks, a leaf that requires grad where the case runs backward and learns them."""
    if sinks is None:
        return None
    return sinks.detach().clone().requires_grad_(requires_grad and case.sinks != "zero")


def draw_values(case: Case, device: torch.device) -> tuple[torch.Tensor, ...]:
    """q, k, v, dout in float32, logical layout, values per the case's regime; then the ALiBi slopes and
    the sinks (None when off), drawn after them so a dense case's tensors do not depend on the variants."""
    g = generator(case.seed, device)
    b, sq, sk, h, hk, d = case.batch, case.seqlen_q, case.seqlen_k, case.nheads, case.nheads_k, case.head_dim
    dv = case.dv

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32)

    if dv == d:
        q, k, v, dout = normal(b, sq, h, d), normal(b, sk, hk, d), normal(b, sk, hk, d), normal(b, sq, h, d)
    else:
        q, k, v, dout = normal(b, sq, h, d), normal(b, sk, hk, d), normal(b, sk, hk, dv), normal(b, sq, h, dv)
    if case.layout == "broadcast":  # before the regimes, so those that relate q to k see the keys laid out
        k, v = _broadcast(k), _broadcast(v)
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
    elif regime == "negative":
        q, k = _negative_rows(case, q, k, g)
    elif regime == "lone-key":
        q, k = _lone_keys(case, q, k)
    elif regime == "tail-mass":
        q, k, v = fp8.tail_mass(case, q, k, v)
    if case.layout == "broadcast":  # again: "outliers" draws per element
        k, v = _broadcast(k), _broadcast(v)
    return q, k, v, dout, _alibi_slopes(case, g, device), _sinks(case, q, k, g, device)


def _broadcast(t: torch.Tensor) -> torch.Tensor:
    """The first batch element's first kv head, everywhere: what a stride-0 expand over both shows."""
    return t[:1, :, :1].expand_as(t)


def _in_range(case: Case, *tensors: torch.Tensor) -> tuple:
    if case.dtype != "fp16":
        return tensors
    return tuple(t.clamp(-FP16_LIMIT, FP16_LIMIT) for t in tensors)


def _negative_rows(case: Case, q: torch.Tensor, k: torch.Tensor, g: torch.Generator):
    """Half the query rows (drawn per batch, row and head) score every key far below zero: every key is
    shifted along one unit direction u (k + KEY_SHIFT u, so each projects on u by KEY_SHIFT +- 4) and those
    rows' queries are -c u, a row maximum about NEGATIVE_MAXIMA[seed's pick]; the other rows keep their
    draw. The magnitude is split between q and k so fp16 holds both."""
    b, sq, h, d = q.shape
    target = NEGATIVE_MAXIMA[int(torch.randint(len(NEGATIVE_MAXIMA), (1,), generator=g, device=q.device))]
    u = torch.randn(d, generator=g, device=q.device)
    u = u / u.norm().clamp(min=1e-6)
    product = abs(target) / (KEY_SHIFT * 0.625 * case.scale)  # c * gain: the row max is about -scale*c*gain*5
    gain = max(1.0, math.sqrt(product / (KEY_SHIFT + 4)))  # |k| elements reach about gain * 12, q's c
    k = gain * (k + KEY_SHIFT * u)
    rows = torch.rand(b, sq, h, 1, generator=g, device=q.device) < 0.5
    q = torch.where(rows, (-product / gain) * u, q)
    return _in_range(case, q, k)


def _lone_keys(case: Case, q: torch.Tensor, k: torch.Tensor):
    """Each row that sees exactly one key (causal with seqlen_q >= seqlen_k, windows of width 0, under the
    default bottom-right alignment) gets the query that scores it LONE_KEY_SCORE: the row's out must be
    that key's value and its lse that score. Keys are scaled so q and k share the magnitude."""
    sq, d = case.seqlen_q, case.head_dim
    k = k * math.sqrt(abs(LONE_KEY_SCORE) / (case.scale * d))
    left, right = case.bounds
    rows = [i for i in range(sq) if case.visible_keys(i) == 1]
    if not rows or case.seqlen_k == 0:
        return _in_range(case, q, k)
    diag = [i + case.seqlen_k - sq for i in rows]
    first = torch.tensor([max(0, j - left) if left is not None else 0 for j in diag], device=q.device)
    kv_head = torch.arange(case.nheads, device=q.device) // case.group
    key = k[:, first][:, :, kv_head]  # [b, rows, h, d]
    alpha = abs(LONE_KEY_SCORE) / (case.scale * (key * key).sum(-1, keepdim=True).clamp(min=1e-12))
    q = q.clone()
    q[:, torch.tensor(rows, device=q.device)] = -alpha * key
    return _in_range(case, q, k)


def _alibi_slopes(case: Case, g: torch.Generator, device: torch.device) -> torch.Tensor | None:
    """The geometric slopes of the ALiBi paper, 2^(-8 (i + 1) / h), each times a factor in [0.5, 2) from
    the seed; "zero": every slope 0."""
    if case.alibi == "off":
        return None
    h = case.nheads
    shape = (case.batch, h) if case.alibi == "batch-head" else (h,)
    base = 2.0 ** (-8.0 * torch.arange(1, h + 1, device=device, dtype=torch.float32) / h)
    slopes = base * (0.5 + 1.5 * torch.rand(shape, generator=g, device=device))
    return torch.zeros_like(slopes) if case.alibi == "zero" else slopes


def _sinks(case: Case, q, k, g: torch.Generator, device: torch.device) -> torch.Tensor | None:
    """One raw logit per head. "around": about the head's rows' log-sum-exp (_row_lse plus a normal draw),
    where sink and keys share the weight and the sink's gradient is as large as it gets; "above"/"below":
    30 past the largest logit the inputs can give, so the sink takes all the weight or none."""
    if case.sinks == "off":
        return None
    h = case.nheads
    if case.sinks == "zero":
        return torch.zeros(h, device=device)
    z = torch.randn(h, generator=g, device=device)
    if case.sinks == "around":
        return z + _row_lse(case, q, k)
    bound = case.scale * float(q.norm(dim=-1).amax()) * float(k.norm(dim=-1).amax()) if q.numel() and k.numel() else 0.0
    if case.softcap:
        bound = min(bound, case.softcap)
    return (bound + 30.0 + z.abs()) * (1 if case.sinks == "above" else -1)


SINK_ROWS, SINK_KEYS = 64, 4096  # the rows and keys of the first batch element _row_lse samples


def _row_lse(case: Case, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """[h] fp32: the median over rows of each head's log-sum-exp of its scaled (and capped) logits, over
    up to SINK_ROWS rows and SINK_KEYS keys of the first batch element, the sum scaled up by the keys left
    out. Windows, masks and ALiBi are left out: the sink lands within a few units of the rows' lse, not on
    it. With no key or no row, log(max(sk, 1)): a row's lse at logits of 0."""
    sq, sk, h = q.shape[1], k.shape[1], case.nheads
    if sq == 0 or sk == 0:
        return torch.full((h,), math.log(max(sk, 1)), device=q.device)
    rows = torch.linspace(0, sq - 1, min(sq, SINK_ROWS), device=q.device).long()
    keys = torch.linspace(0, sk - 1, min(sk, SINK_KEYS), device=q.device).long()
    kv_head = torch.arange(h, device=q.device) // case.group
    qs = q[0, rows].transpose(0, 1)  # [h, rows, d]
    ks = k[0, keys][:, kv_head].transpose(0, 1)  # [h, keys, d]
    s = case.scale * (qs @ ks.transpose(1, 2))
    if case.softcap:
        s = case.softcap * torch.tanh(s / case.softcap)
    lse = torch.logsumexp(s, dim=-1) + math.log(sk / len(keys))
    return lse.median(dim=1).values.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


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
    """Place q, k, v in memory per case.layout, each store inside NaN margins (_margined); with
    requires_grad the margined buffer is the autograd leaf."""
    h, hk, d = case.nheads, case.nheads_k, case.head_dim
    layout = case.layout
    if layout == "contiguous":
        return [margined(t, requires_grad) for t in (q, k, v)]
    if layout == "transposed":  # stored [b, h, s, d], seen through a transpose
        return [margined(t.transpose(1, 2), requires_grad).transpose(1, 2) for t in (q, k, v)]
    if layout == "strided":
        # Row pitch wider than head_dim, the gap poisoned with NaN: a kernel that reads past the
        # head dim gets NaN, which the verdict cannot miss.
        out = []
        for t in (q, k, v):
            width = t.shape[-1]
            store = torch.full((*t.shape[:-1], width + 8), float("nan"), dtype=t.dtype, device=t.device)
            store[..., :width] = t
            out.append(margined(store, requires_grad)[..., :width])
        return out
    if layout == "broadcast":  # k and v: one [1, sk, 1, d] store expanded, strides 0 over batch and kv heads
        return [margined(q, requires_grad)] + [margined(t[:1, :, :1].contiguous(), requires_grad).expand(t.shape)
                                                for t in (k, v)]
    if layout == "spread":
        # each stride at least twice the contiguous one (the cuDNN frontend's probe), the gaps NaN
        out = []
        for t in (q, k, v):
            b, s, n, width = t.shape
            store = torch.full((b, 2 * s, 2 * n, 2 * (-(-width // 8) * 8)), float("nan"), dtype=t.dtype,
                               device=t.device)
            store[:, ::2, ::2, :width] = t
            out.append(margined(store, requires_grad)[:, ::2, ::2, :width])
        return out
    # packed: one buffer, as a fused QKV projection produces it
    if case.dv != d:  # v is narrower or wider: only q and k share a buffer (MLA projects them together)
        if case.seqlen_q != case.seqlen_k:
            return [margined(t, requires_grad) for t in (q, k, v)]
        store = margined(torch.cat([q, k], dim=2), requires_grad)
        return [store[:, :, :h], store[:, :, h:], margined(v, requires_grad)]
    if case.seqlen_q == case.seqlen_k:
        store = margined(torch.cat([q, k, v], dim=2), requires_grad)  # [b, s, h + 2hk, d]
        return [store[:, :, :h], store[:, :, h:h + hk], store[:, :, h + hk:]]
    kv = margined(torch.cat([k, v], dim=2), requires_grad)  # q separate, kv packed [b, sk, 2hk, d]
    return [margined(q, requires_grad), kv[:, :, :hk], kv[:, :, hk:]]
