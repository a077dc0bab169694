"""A dense subject run one sequence at a time: the varlen and paged paths of the reference-style
built-ins (sdpa-math, flex). A varlen batch is cut at cu_seqlens; a paged cache is gathered through the
block table first (ragged.gather_pages), then each sequence is the dense problem it is. A reference path,
declared as such: it checks faverify's ragged cases and a user's conventions, not a ragged kernel.
"""
from __future__ import annotations

import torch

from faverify.cases.ragged import gather_pages


def ragged(dense, sequence=None):
    """dense(q, k, v, **kwargs) -> out or (out, lse), made to take flash-attn's varlen keywords
    (cu_seqlens_q/k, max_seqlen_q/k: q, k, v packed [total, heads, d]) and its kvcache ones (block_table,
    cache_seqlens: k and v the page pools). sequence: what runs each sequence of a ragged batch (dense's
    own call unless given)."""
    sequence = sequence or dense
    def fn(q, k, v, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
           block_table=None, cache_seqlens=None, alibi_slopes=None, **kwargs):
        if cu_seqlens_q is None and block_table is None:
            return dense(q, k, v, alibi_slopes=alibi_slopes, **kwargs) if alibi_slopes is not None else \
                dense(q, k, v, **kwargs)
        outs, lses = [], []
        no_keys = {}  # the lse of a sequence without keys, where sinks make it other than -inf
        sequences = (len(cu_seqlens_q) if cu_seqlens_q is not None else len(cache_seqlens) + 1) - 1
        for b in range(sequences):
            if cu_seqlens_q is not None:
                (q0, q1), (k0, k1) = ((int(c[b]), int(c[b + 1])) for c in (cu_seqlens_q, cu_seqlens_k))
                qb, kb, vb = q[q0:q1].unsqueeze(0), k[k0:k1].unsqueeze(0), v[k0:k1].unsqueeze(0)
            else:
                n = int(cache_seqlens[b])
                qb, kb, vb = q[b:b + 1], gather_pages(k, block_table, n, b), gather_pages(v, block_table, n, b)
            if qb.shape[1] == 0:
                continue
            extra = {} if alibi_slopes is None else {
                "alibi_slopes": alibi_slopes[b:b + 1] if alibi_slopes.dim() == 2 else alibi_slopes}
            if kb.shape[1] == 0:  # no key: out 0, lse -inf (if the subject returns lse), or the sink's logit
                out, lse = qb.new_zeros(*qb.shape[:3], vb.shape[3]), None
                if kwargs.get("sinks") is not None:
                    no_keys[len(outs)] = kwargs["sinks"].detach().float()[None, :, None].expand(
                        1, qb.shape[2], qb.shape[1])
            else:
                result = sequence(qb, kb, vb, **kwargs, **extra)
                out, lse = result if isinstance(result, tuple) else (result, None)
            outs.append(out)
            lses.append(lse)
        with_lse = any(lse is not None for lse in lses)
        lses = [lse if lse is not None else no_keys[i] if i in no_keys else
                torch.full((1, o.shape[2], o.shape[1]), float("-inf"), device=q.device)
                for i, (lse, o) in enumerate(zip(lses, outs))]
        if block_table is not None:
            out = torch.cat(outs)
            return (out, torch.cat(lses)) if with_lse else out
        tail = q.shape[0] - int(cu_seqlens_q[-1])
        h, dv = q.shape[1], v.shape[2]
        out = torch.cat([o[0] for o in outs] + [q.new_zeros(tail, h, dv)])
        if not with_lse:
            return out
        return out, torch.cat([lse[0] for lse in lses] + [torch.full((h, tail), float("-inf"), device=q.device)], dim=1)
    return fn
