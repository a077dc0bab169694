"""Ragged subjects with one planted bug each (varlen, paged, split-KV): faverify must catch every one.

Plain torch, independent of faverify's own packing and gathering (ragged.py), in flash-attn's varlen and
kvcache keywords. Causal masks only; each sequence is planted._attention's dense problem.
"""
import torch

from property_tests.planted import _attention

VARLEN = {"varlen": True, "dense": False}
PAGED = {"paged": True, "dense": False}


def _one(q, k, v, causal, softmax_scale):
    """One sequence, [1, s, h, d]: out [1, sq, h, dv] (0 where it has no key)."""
    if k.shape[1] == 0:
        return q.new_zeros(*q.shape[:3], v.shape[3])
    return _attention(q, k, v, causal=causal, scale=softmax_scale)


def _varlen(q, k, v, cu_q, cu_k, causal, softmax_scale, past_end=0):
    """Each sequence of a packed batch; past_end: keys read past each sequence's end."""
    outs = []
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1]) + past_end
        if q1 > q0:
            outs.append(_one(q[q0:q1][None], k[k0:k1][None], v[k0:k1][None], causal, softmax_scale)[0])
    tail = q.shape[0] - int(cu_q[-1])
    return torch.cat(outs + [q.new_zeros(tail, q.shape[1], v.shape[2])])


def varlen_correct(q, k, v, *, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """Each sequence on its own: the control."""
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale)


def varlen_reads_next_key(q, k, v, *, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                          max_seqlen_k):
    """Reads one key past each sequence's end: the next sequence's first key (or the tail's)."""
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, past_end=1)


def varlen_into_buffer(q, k, v, *, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                       max_seqlen_k, out):
    """Writes into the out buffer it is given, the sequences' rows only: the control."""
    total = int(cu_seqlens_q[-1])
    out[:total] = _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale)[:total].detach()
    return out


def varlen_first_sequence_only(q, k, v, *, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                               max_seqlen_k, out):
    """Writes the first sequence's rows of the out buffer it is given, and no other (pytorch#194167's class:
    the rows of every sequence after the first left as the buffer held them)."""
    first = int(cu_seqlens_q[1])
    out[:first] = _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale)[:first].detach()
    return out


def varlen_writes_tail(q, k, v, *, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                       max_seqlen_k, out):
    """Writes into the out buffer it is given, zeros in the tail past the last sequence as well."""
    out.copy_(_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale).detach())
    return out


def _paged(q, k_cache, v_cache, block_table, cache_seqlens, causal, softmax_scale, page_of):
    ps = k_cache.shape[1]
    outs = []
    for b in range(q.shape[0]):
        n = int(cache_seqlens[b])
        t = torch.arange(n, device=q.device)
        pages = page_of(b, t // ps).long()
        outs.append(_one(q[b:b + 1], k_cache[pages, t % ps][None], v_cache[pages, t % ps][None], causal, softmax_scale))
    return torch.cat(outs)


def paged_correct(q, k_cache, v_cache, *, causal, softmax_scale, block_table, cache_seqlens):
    """Gathers each token's page through the block table: the control."""
    return _paged(q, k_cache, v_cache, block_table, cache_seqlens, causal, softmax_scale,
                  lambda b, p: block_table[b, p])


def paged_mtp_top_left(q, k_cache, v_cache, *, causal, softmax_scale, block_table, cache_seqlens):
    """A multi-token decode (several query tokens a sequence, as speculative decoding verifies) whose causal
    mask is aligned top-left: query i sees keys 0..i, not the cache up to its own position."""
    ps = k_cache.shape[1]
    outs = []
    for b in range(q.shape[0]):
        n = int(cache_seqlens[b])
        t = torch.arange(n, device=q.device)
        pages = block_table[b, t // ps].long()
        k, v = k_cache[pages, t % ps][None], v_cache[pages, t % ps][None]
        if n == 0:
            outs.append(q.new_zeros(1, *q.shape[1:3], v_cache.shape[3]))
        else:
            outs.append(_attention(q[b:b + 1], k, v, causal=causal, scale=softmax_scale,
                                   mask_top_left=q.shape[1] > 1))
    return torch.cat(outs)


def paged_in_order(q, k_cache, v_cache, *, causal, softmax_scale, block_table, cache_seqlens):
    """Takes a sequence's pages to follow its first one in the pool, ignoring the rest of the block table."""
    return _paged(q, k_cache, v_cache, block_table, cache_seqlens, causal, softmax_scale,
                  lambda b, p: block_table[b, 0] + p)


def paged_int32_offsets(q, k_cache, v_cache, *, causal, softmax_scale, block_table, cache_seqlens):
    """Computes each token's element offset in the pool as page * page_elements in int32, which wraps past
    2^31 elements (the pool read flat at the wrapped offset)."""
    return paged_flat(q, k_cache, v_cache, block_table, cache_seqlens, causal, softmax_scale,
                      lambda offset: ((offset + (1 << 31)) % (1 << 32) - (1 << 31)).clamp(min=0))


def paged_flat(q, k_cache, v_cache, block_table, cache_seqlens, causal, softmax_scale, wrapped):
    """Each token's keys read from the pool flat, from wrapped(its element offset) on (the offsets int64)."""
    ps, rest = k_cache.shape[1], k_cache.shape[2:]
    page_elements = k_cache[0].numel()
    outs = []
    for b in range(q.shape[0]):
        n = int(cache_seqlens[b])
        t = torch.arange(n, device=q.device)
        start = wrapped(block_table[b, t // ps].long() * page_elements + (t % ps) * rest.numel())
        index = start[:, None] + torch.arange(rest.numel(), device=q.device)
        kb, vb = (c.reshape(-1)[index].reshape(1, n, *rest) if c.numel() else c for c in (k_cache, v_cache))
        outs.append(_one(q[b:b + 1], kb, vb, causal, softmax_scale))
    return torch.cat(outs)


def _combine(outs, lses, guard: bool):
    m = lses.amax(0)
    if guard:
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp(lses - m)
    total = w.sum(0)
    lse = m + torch.log(total)
    if guard:
        weight = torch.where(total > 0, w / total.clamp(min=1e-300), torch.zeros_like(w))
    else:
        weight = w / total
    return (weight.permute(0, 1, 3, 2).unsqueeze(-1) * outs).sum(0), lse


def combine_correct(outs, lses):
    """lse = logsumexp of the partials', out their lse-weighted sum, empty partials (0, -inf) kept so."""
    return _combine(outs, lses, guard=True)


def combine_nan_on_empty(outs, lses):
    """The combine without the guard: exp(-inf - (-inf)) is NaN where every partial is empty."""
    return _combine(outs, lses, guard=False)


def merge_correct(outs, lses):
    """A context-parallel merge of shards' partials: the combine, judged on shards as on split-KV ranges."""
    return _combine(outs, lses, guard=True)


def merge_fills_empty_lse(outs, lses):
    """A merge that guards against -inf by reading an empty shard's lse as 0: the shard's out of 0 is then
    averaged in with weight e^0 instead of dropped."""
    return _combine(outs, torch.where(torch.isinf(lses), torch.zeros_like(lses), lses), guard=True)


def splits_correct(q, k, v, *, causal, softmax_scale, num_splits=1):
    """Dense attention computed as num_splits partials over whole key ranges and combined: returns out,
    lse and the partials."""
    return _split(q, k, v, causal, softmax_scale, num_splits, drop_last_key=False)


def splits_drop_last_key(q, k, v, *, causal, softmax_scale, num_splits=1):
    """Each split ends one key early (the split count off by one at the cache's end)."""
    return _split(q, k, v, causal, softmax_scale, num_splits, drop_last_key=True)


def _split(q, k, v, causal, softmax_scale, splits, drop_last_key):
    b, sq, h, d = q.shape
    sk = k.shape[1]
    per = max(1, -(-sk // splits))
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    qt = q.transpose(1, 2).float()
    kt, vt = (t.transpose(1, 2).float().repeat_interleave(h // k.shape[2], dim=1) for t in (k, v))
    i = torch.arange(sq, device=q.device)[:, None]
    outs, lses = [], []
    for s in range(splits):
        lo, hi = min(sk, s * per), min(sk, (s + 1) * per)
        if drop_last_key and hi > lo:
            hi -= 1
        j = torch.arange(lo, hi, device=q.device)[None, :]
        logits = qt @ kt[:, :, lo:hi].transpose(-1, -2) * scale
        if causal:
            logits = logits.masked_fill(j > i + sk - sq, float("-inf"))
        lse = torch.logsumexp(logits, dim=-1) if hi > lo else torch.full((b, h, sq), float("-inf"), device=q.device)
        # normalized by the weights' sum: exp(logits - lse) sums to 2 where fp32 cannot tell lse from the max
        top = logits.amax(dim=-1, keepdim=True) if hi > lo else torch.zeros(b, h, sq, 1, device=q.device)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        weights = torch.exp(logits - top)
        total = weights.sum(dim=-1, keepdim=True)
        p = torch.where(total > 0, weights / total, torch.zeros_like(weights))
        outs.append((p @ vt[:, :, lo:hi]).transpose(1, 2))
        lses.append(lse)
    outs, lses = torch.stack(outs), torch.stack(lses)
    out, lse = _combine(outs, lses, guard=True)
    return out.to(q.dtype), lse, outs, lses


for _fn in (varlen_correct, varlen_reads_next_key):
    _fn.faverify_capabilities = dict(VARLEN, backward=False)
for _fn in (varlen_into_buffer, varlen_writes_tail, varlen_first_sequence_only):
    _fn.faverify_capabilities = dict(VARLEN, backward=False, out_buffer=True)
for _fn in (paged_correct, paged_in_order, paged_int32_offsets, paged_mtp_top_left):
    _fn.faverify_capabilities = dict(PAGED, backward=False)
for _fn in (combine_correct, combine_nan_on_empty):
    _fn.faverify_capabilities = {"combine": True, "splits": True, "paged": True, "backward": False}
for _fn in (merge_correct, merge_fills_empty_lse):
    _fn.faverify_capabilities = {"combine": True, "splits": True, "shards": True, "backward": False}
for _fn in (splits_correct, splits_drop_last_key):
    _fn.faverify_capabilities = {"splits": True, "backward": False, "lse": True}
