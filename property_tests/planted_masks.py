"""Subjects that take masks, biases and score_mods, each with one planted bug, and the control beside them.

Plain torch with autograd in fp32 on [b, s, h, d], bottom-right causal; attn_mask is SDPA's (bool: True
keeps; float: added), block_mask and block_size a block pattern's, score_mod FlexAttention's.
"""
import torch

from property_tests.planted import heads_first


class _HeadZeroGrad(torch.autograd.Function):
    """Expands a [B, 1, SQ, SK] bias over h heads; its backward takes head 0's gradient instead of the sum
    over heads."""

    @staticmethod
    def forward(ctx, bias, h):
        return bias.expand(bias.shape[0], h, *bias.shape[2:]).clone()

    @staticmethod
    def backward(ctx, grad):
        return grad[:, :1].clone(), None


def _attend(q, k, v, *, causal, softmax_scale, attn_mask=None, block_mask=None, block_size=None, score_mod=None,
            bug=None):
    b, sq, h, d = q.shape
    sk = k.shape[1]
    qt, kt, vt, scale = heads_first(q, k, v, softmax_scale)
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    keep = torch.ones(1, 1, sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        keep = keep & (j <= i + sk - sq)
    causal_keep = keep
    if bug != "nan-key-leaks":  # what a kernel that skips or zeroes masked keys does
        kt, vt = kt.nan_to_num(nan=0.0), vt.nan_to_num(nan=0.0)
    s = qt @ kt.transpose(-1, -2)
    if score_mod is not None:
        grid = (torch.arange(b, device=q.device)[:, None, None, None], torch.arange(h, device=q.device)[None, :, None,
                                                                                                        None],
                i[None, None], j[None, None])
        s = score_mod(s, *grid) * scale if bug == "score-mod-before-scale" else score_mod(s * scale, *grid)
    else:
        s = s * scale
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        mask = attn_mask[:1] if bug == "mask-batch-zero" else attn_mask
        keep = keep & mask
    elif attn_mask is not None:
        bias = attn_mask.float()
        if bug == "dbias-head-zero" and bias.shape[1] == 1:
            bias = _HeadZeroGrad.apply(bias, h)
        s = s + bias
    if block_mask is not None:
        n = 128 if bug == "block-size-128" else block_size
        keep = keep & _expanded(block_mask, n, sq, sk)
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, dim=-1)
    # the bug: rows the causal mask empties are handled, rows the attn_mask empties keep softmax's NaN
    seen = causal_keep if bug == "nan-for-empty-row" else keep
    p = torch.where(seen.expand_as(p).any(-1, keepdim=True), p, torch.zeros_like(p))
    o = p @ vt
    return o.transpose(1, 2).to(q.dtype)


def _expanded(blocks, n, sq, sk):
    """Element (i, j) reads block (i // n, j // n); read at a size smaller than the blocks', the last block
    stands for the rest."""
    rows = (torch.arange(sq, device=blocks.device) // n).clamp(max=blocks.shape[2] - 1)
    cols = (torch.arange(sk, device=blocks.device) // n).clamp(max=blocks.shape[3] - 1)
    return blocks[:, :, rows][:, :, :, cols]


_MASKS = {"mask": True, "bias": True, "bias_grad": True, "mask_nan": True}


def masked_correct(q, k, v, *, causal, softmax_scale, attn_mask=None):
    """Masks, biases and their gradient, right: the control."""
    return _attend(q, k, v, causal=causal, softmax_scale=softmax_scale, attn_mask=attn_mask)


def _planted(bug, caps=_MASKS, **fixed):
    def fn(q, k, v, *, causal, softmax_scale, attn_mask=None):
        return _attend(q, k, v, causal=causal, softmax_scale=softmax_scale, attn_mask=attn_mask, bug=bug)
    fn.__doc__ = f"masks with the bug {bug}"
    fn.faverify_capabilities = caps
    return fn


masked_correct.faverify_capabilities = _MASKS
nan_for_empty_row = _planted("nan-for-empty-row")  # softmax of a row of -inf: NaN
nan_key_leaks = _planted("nan-key-leaks")  # P @ V over every key: 0 * NaN where a masked key holds NaN
mask_batch_zero = _planted("mask-batch-zero")  # batch element 0's mask for every batch element
dbias_head_zero = _planted("dbias-head-zero")  # dbias of a bias shared by the heads: head 0's, not the sum


def blocks_correct(q, k, v, *, causal, softmax_scale, block_mask=None, block_size=None):
    """A block mask read at its block size: the control."""
    return _attend(q, k, v, causal=causal, softmax_scale=softmax_scale, block_mask=block_mask, block_size=block_size)


def block_size_128(q, k, v, *, causal, softmax_scale, block_mask=None, block_size=None):
    """A block mask read at the kernel's own tile size, 128, whatever block_size says."""
    return _attend(q, k, v, causal=causal, softmax_scale=softmax_scale, block_mask=block_mask, block_size=block_size,
                   bug="block-size-128")


blocks_correct.faverify_capabilities = {"block_mask": True}
block_size_128.faverify_capabilities = {"block_mask": True}


def score_mod_correct(q, k, v, *, causal, softmax_scale, score_mod=None):
    """A score_mod applied to the scaled logit: the control."""
    return _attend(q, k, v, causal=causal, softmax_scale=softmax_scale, score_mod=score_mod)


def score_mod_before_scale(q, k, v, *, causal, softmax_scale, score_mod=None):
    """A score_mod applied to q.k, then scaled."""
    return _attend(q, k, v, causal=causal, softmax_scale=softmax_scale, score_mod=score_mod,
                   bug="score-mod-before-scale")


score_mod_correct.faverify_capabilities = {"score_mod": True}
score_mod_before_scale.faverify_capabilities = {"score_mod": True}
