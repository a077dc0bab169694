"""Draw a case's tensors from its seed: the value regime first, then the memory layout.

Values are drawn in the logical [batch, seqlen, nheads, headdim] shape with a torch.Generator on the
target device, so the same case gives the same values in every layout, and the same tensors every time
on one device. Layouts then place those values in memory the way real callers do.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from faverify.cases import fp8, masks, ragged, sparse
from faverify.cases.case import Case
from faverify.cases.conventions import DEFAULT as DEFAULT_CONVENTIONS
from faverify.cases.conventions import Conventions
from faverify.cases.margins import margined
from faverify.cases.values import draw_values, generator
from faverify.cases.variant import Variant
from faverify.cases.vocabulary import MAX_SEED
from faverify.dtypes import TORCH

DLSE_STREAM = 0x5EED  # dlse's seed, offset from the case's


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
    # sparse key indices (sparse.py): int32 [b, sq, hk, topk], the keys each row of each kv head sees
    indices: torch.Tensor | None = None

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


# the keywords of Inputs.extras, flash-attn's names, then the masks' (subjects.keywords.variant_keywords picks
# the form of a mask each subject takes)
EXTRAS = ("alibi_slopes", "sinks", "cu_seqlens_q", "cu_seqlens_k", "block_table", "cache_seqlens", "mask_mod",
          "attn_mask", "block_mask", "bias", "score_mod", "q_descale", "k_descale", "v_descale", "indices")


def variant_of(case: Case, x: Inputs, conventions: Conventions = DEFAULT_CONVENTIONS) -> Variant:
    """What the reference adds to dense attention for this case and its inputs, under the conventions."""
    left, right = case.bounds
    mask, bias = x.attn_mask, None if x.bias is None else x.bias.detach()
    multiplicity = None
    if x.indices is not None:  # the keys the indices name, as a mask, and each duplicate's weight
        mask, multiplicity = sparse.visibility(x.indices, case.seqlen_k, case.nheads, conventions.sparse_duplicates)
    return Variant(left=left, right=right, softcap=case.softcap, alibi_slopes=x.alibi_slopes,
                   sinks=None if x.sinks is None else x.sinks.detach(), sinks_learned=not x.fixed_sinks,
                   offset=conventions.offset(case.seqlen_q, case.seqlen_k), alibi_form=conventions.alibi,
                   mask=mask, bias=bias, score_mod=x.score_mod, multiplicity=multiplicity)


def make_inputs(case: Case, device: torch.device | str, *, requires_grad: bool = False) -> Inputs:
    device = torch.device(device)
    dtype = TORCH[case.dtype]
    drawn = draw_values(case, device)
    values = Inputs(*(t.to(dtype) for t in drawn[:4]), *drawn[4:])
    if case.fp8 is not None:  # q, k, v in e4m3 with their descales; dO in the output's dtype
        (values.q, values.q_descale), (values.k, values.k_descale), (values.v, values.v_descale) = (
            fp8.quantize(case, t, case.nheads_k, keys=i > 0) for i, t in enumerate(drawn[:3]))
    if case.mask is not None or case.bias is not None or case.score_mod != "off":
        values = _with_masks(case, values, device)
    return lay_out(case, values, requires_grad=requires_grad)


def _with_masks(case: Case, values: Inputs, device: torch.device) -> Inputs:
    """The case's mask, bias and score_mod (masks.draw); with mask_nan, NaN in k and v at every key that
    no row may see, which a kernel must not let into any output."""
    drawn = masks.draw(case, device)
    if case.mask is not None and case.mask.nan:
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
    if case.kv_shared:  # v: k's leading columns in k's own storage, a leaf of its own so dk and dv stay apart
        v = k.detach()[..., :case.dv].requires_grad_(requires_grad)
    dout = values.dout
    if case.layout == "transposed":  # dO from a transpose as well, as callers' gradients often are
        dout = dout.transpose(1, 2).contiguous().transpose(1, 2)
    sinks = _sinks_leaf(case, values.sinks, requires_grad)
    bias = values.bias
    if bias is not None:
        bias = bias.detach().clone().requires_grad_(requires_grad and case.bias is not None and case.bias.grad)
    # dlse and the indices come from streams of their own, here: a golden file's stored inputs hold neither
    dlse = values.dlse if values.dlse is not None or case.lse_grad == "off" else _dlse(case, q.device)
    if case.lse_grad == "alone":  # the loss on lse alone: no gradient reaches out
        dout = torch.zeros_like(dout)
    return Inputs(q, k, v, dout, values.alibi_slopes, sinks, case.sinks == "zero", mask_mod=values.mask_mod,
                  attn_mask=values.attn_mask, block_mask=values.block_mask, bias=bias, score_mod=values.score_mod,
                  q_descale=values.q_descale, k_descale=values.k_descale, v_descale=values.v_descale, dlse=dlse,
                  indices=values.indices if values.indices is not None or case.sparse is None
                  else sparse.draw(case, q.device))


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
