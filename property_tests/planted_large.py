"""Subjects whose offsets wrap, for the tests of large cases (faverify/cases/large.py), on their small
analogue: the boundary is WRAP elements, and an offset at or past it wraps back into it (offset % WRAP), as a
32-bit offset past 2^31 - 1 does on a GPU. planted.correct is their control.

Plain torch with autograd, on [b, s, h, d]; each reads its tensors through row-major offsets, as a kernel
that takes contiguous inputs does.
"""
import torch

from property_tests.planted import _attention
from property_tests.planted_ragged import PAGED, paged_flat

WRAP = 1 << 12
ACCUMULATOR_ROWS = 128  # the rows each sequence of the dq accumulator is padded to, as flash-attention's


def _read(t):
    """t read at wrapped offsets: the element at row-major offset o is t's at o % WRAP."""
    flat = t.reshape(-1)
    return flat[torch.arange(flat.numel(), device=t.device) % WRAP].view(t.shape)


def wrapped_inputs(q, k, v, *, causal, softmax_scale):
    """Reads q, k and v at wrapped offsets: the entries past WRAP elements read earlier ones' values, and
    their gradients land there."""
    return _attention(_read(q), _read(k), _read(v), causal=causal, scale=softmax_scale)


class _Accumulated(torch.autograd.Function):
    """The identity forward; backward adds dq into an fp32 accumulator [b, h, padded rows, d] at wrapped
    offsets, so an entry past WRAP elements of it adds into an earlier entry's rows."""

    @staticmethod
    def forward(ctx, q):
        return q.clone()

    @staticmethod
    def backward(ctx, dq):
        b, sq, h, d = dq.shape
        padded = torch.zeros(b, h, -(-sq // ACCUMULATOR_ROWS) * ACCUMULATOR_ROWS, d, dtype=torch.float32,
                             device=dq.device)
        padded[:, :, :sq] = dq.transpose(1, 2)
        accumulator = torch.zeros_like(padded)
        offsets = torch.arange(padded.numel(), device=dq.device) % WRAP
        accumulator.view(-1).index_add_(0, offsets, padded.reshape(-1))
        return accumulator[:, :, :sq].transpose(1, 2).to(dq.dtype)


def wrapped_accumulator(q, k, v, *, causal, softmax_scale):
    """The forward right; dq through an accumulator whose offsets wrap (flash-attention's dq_accum at batch
    8300 x seqlen 1 x 16 heads x d128: inputs below 2^31 elements, the padded accumulator past it)."""
    return _attention(_Accumulated.apply(q), k, v, causal=causal, scale=softmax_scale)


def wrapped_pool(q, k_cache, v_cache, *, causal, softmax_scale, block_table, cache_seqlens):
    """Reads each token's keys from the pool at a wrapped element offset (page * page_elements % WRAP)."""
    return paged_flat(q, k_cache, v_cache, block_table, cache_seqlens, causal, softmax_scale,
                      lambda offset: offset % WRAP)


def pool_correct(q, k_cache, v_cache, *, causal, softmax_scale, block_table, cache_seqlens):
    """The same flat read, unwrapped: the control of wrapped_pool."""
    return paged_flat(q, k_cache, v_cache, block_table, cache_seqlens, causal, softmax_scale, lambda offset: offset)


for _fn in (wrapped_pool, pool_correct):
    _fn.faverify_capabilities = dict(PAGED, backward=False)
