"""Sparse-index subjects (fp32 with autograd), independent of faverify's own reading of the indices
(cases/sparse.py): `gather_correct` gathers the listed keys as FlashMLA's sparse kernels do,
`mask_correct` masks the keys not listed (a key listed twice counts once, declared so), and each other
plants one bug of the kind a sparse kernel has."""
import torch

from property_tests.planted import heads_first

SPARSE = {"sparse": True, "lse": True}


def _every_key(q, k, causal):
    """A dense case's indices: every key, or with causal those at or before each row's diagonal."""
    b, sq = q.shape[0], q.shape[1]
    sk, hk = k.shape[1], k.shape[2]
    j = torch.arange(sk, device=q.device).expand(sq, sk)
    if causal:
        j = torch.where(j > torch.arange(sq, device=q.device)[:, None] + sk - sq, -1, j)
    return j[None, :, None, :].expand(b, sq, hk, sk)


def _gather(q, k, v, indices, softmax_scale, causal=False, bug=None):
    b, sq, h, d = q.shape
    sk, hk, dv = k.shape[1], k.shape[2], v.shape[3]
    if indices is None:  # a dense case, read right: the bugs are the sparse path's
        indices, bug = _every_key(q, k, causal), None
    g = h // hk
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    valid = (indices >= 0) & (indices < sk)
    if bug == "minus-one-as-zero":  # an empty slot's -1 clamped into a real key: key 0 read in its place
        valid = indices < sk
    idx = indices.long().clamp(0, max(sk - 1, 0))
    rows = torch.arange(b, device=q.device)[:, None, None, None]
    heads = torch.arange(hk, device=q.device)[None, None, :, None]
    kg, vg = (t.float()[rows, idx, heads] if sk else t.float().new_zeros(*idx.shape, t.shape[3])
              for t in (k, v))  # [b, sq, hk, topk, d]
    qg = q.float().reshape(b, sq, hk, g, d)
    s = torch.einsum("bshgd,bshtd->bshgt", qg, kg) * scale
    s = s.masked_fill(~valid[:, :, :, None, :], float("-inf"))
    if bug == "nan-on-empty":  # the softmax of a row of -inf, unguarded
        p = torch.softmax(s, dim=-1)
    else:
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    out = torch.einsum("bshgt,bshtd->bshgd", p, vg).reshape(b, sq, h, dv)
    lse = torch.logsumexp(s, dim=-1).reshape(b, sq, h).transpose(1, 2)
    return out.to(q.dtype), lse.float()


def gather_correct(q, k, v, *, causal, softmax_scale, indices=None):
    """Gathers each row's listed keys (a key listed twice weighs twice): the control."""
    return _gather(q, k, v, indices, softmax_scale, causal)


def minus_one_as_zero(q, k, v, *, causal, softmax_scale, indices=None):
    """Reads an empty slot (-1) as key 0."""
    return _gather(q, k, v, indices, softmax_scale, causal, bug="minus-one-as-zero")


def nan_on_empty(q, k, v, *, causal, softmax_scale, indices=None):
    """A row whose every index is invalid gives NaN, not out 0 and lse -inf."""
    return _gather(q, k, v, indices, softmax_scale, causal, bug="nan-on-empty")


def mask_correct(q, k, v, *, causal, softmax_scale, indices=None):
    """Masks the keys no index lists: a key listed twice counts once (declared: sparse_duplicates once)."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    qt, kt, vt, scale = heads_first(q, k, v, softmax_scale)
    indices = _every_key(q, k, causal) if indices is None else indices
    valid = (indices >= 0) & (indices < sk)
    keep = torch.zeros(b, sq, hk, sk + 1, dtype=torch.bool, device=q.device)
    keep.scatter_(-1, torch.where(valid, indices.long(), sk), True)
    keep = keep[..., :sk].permute(0, 2, 1, 3).repeat_interleave(h // hk, dim=1)  # [b, h, sq, sk]
    s = (qt @ kt.transpose(-1, -2) * scale).masked_fill(~keep, float("-inf"))
    out = (torch.softmax(s, dim=-1).nan_to_num(0.0) @ vt).transpose(1, 2).to(q.dtype)
    return out, torch.logsumexp(s, dim=-1).float()


for _fn in (gather_correct, minus_one_as_zero, nan_on_empty):
    _fn.faverify_capabilities = dict(SPARSE)
mask_correct.faverify_capabilities = dict(SPARSE, conventions={"sparse_duplicates": "once"})
