"""The edges of each feature: the cases where kernels break (a sequence with no key, a mask per batch element
and head, a window of width 0), named, so a run counts how often it drew each and the draw's weights can be
held to reaching every one of them.

A fuzz that never draws an edge cannot find the bug that lives there, however right its judging is. Each
run's summary counts the cases per edge (KernelStats.edges); property_tests/test_edges.py holds the draw
to every edge of every feature at least EDGE_FLOOR times in EDGE_CASES cases.
"""
from __future__ import annotations

from typing import Callable

from faverify.cases.case import Case

EDGE_CASES, EDGE_FLOOR = 200, 3  # every edge of a feature a subject declares, at least this often in that many


def _rows_without_key(c: Case) -> bool:
    return any(c.sequence(i).empty_rows() != (0, 0) for i in range(len(c.sequences))) if c.kind != "dense" \
        else c.empty_rows() != (0, 0)


def _mask_empties_rows(c: Case) -> bool:
    """Whether the case's mask pattern leaves a query row without a key, from its fields alone: a padding
    length short of the rows or with no key, documents that leave no key for the rows past them, a block
    or random mask that masks everything."""
    m = c.mask
    if m is None:
        return False
    if m.pattern == "padding":
        return any(q < c.seqlen_q or k == 0 for q, k in m.lengths)
    if m.pattern == "document":
        return sum(q for q, _ in m.lengths) < c.seqlen_q and sum(k for _, k in m.lengths) >= c.seqlen_k \
            or any(q > 0 and k == 0 for q, k in m.lengths)
    return m.pattern in ("block", "random") and m.rate == 100


def _bias(c: Case) -> str:
    """What the case's bias holds ("normal", "large", "min"), or "off"."""
    return "off" if c.bias is None else c.bias.values


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


Edge = tuple  # (name, predicate on a Case)

# feature -> its edges; "shape" applies to every case
EDGES: dict[str, tuple] = {
    "shape": (
        ("one key", lambda c: any(k == 1 for _, k in c.sequences)),
        ("seqlen_q 1", lambda c: c.seqlen_q == 1),
        ("seqlen_q > seqlen_k", lambda c: c.seqlen_q > c.seqlen_k),
        ("rows that see no key", _rows_without_key),
        ("GQA", lambda c: 1 < c.nheads_k < c.nheads),
        ("MQA", lambda c: c.nheads_k == 1 < c.nheads),
        ("batch and heads >= 2", lambda c: c.batch >= 2 and c.nheads >= 2),
        ("head dim not a multiple of 8", lambda c: c.head_dim % 8 != 0),
    ),
    "window": (
        ("left bound 0", lambda c: c.window[0] == 0),
        ("right bound 0", lambda c: c.window[1] == 0),
        ("one side unbounded", lambda c: -1 in c.window and c.window != (-1, -1)),
        ("wider than the keys", lambda c: max(c.window) >= c.seqlen_k),
        ("rows it leaves without a key", lambda c: c.window != (-1, -1) and _rows_without_key(c)),
    ),
    "softcap": (
        ("cap <= 1", lambda c: 0 < c.softcap <= 1),
        ("cap >= 30", lambda c: c.softcap >= 30),
    ),
    "alibi": tuple((form, lambda c, f=form: c.alibi == f) for form in ("head", "batch-head", "zero")),
    "sinks": tuple((place, lambda c, p=place: c.sinks == p) for place in ("around", "above", "below")) + (
        ("the off-by-one sink (a fixed 0)", lambda c: c.sinks == "zero"),
        ("sinks on rows that see no key", lambda c: c.sinks != "off" and _rows_without_key(c)),
    ),
    "head_dim_v": (
        ("v narrower", lambda c: c.head_dim_v is not None and c.head_dim_v < c.head_dim),
        ("v wider", lambda c: c.head_dim_v is not None and c.head_dim_v > c.head_dim),
    ),
    "varlen": (
        ("a sequence with no key, not causal", lambda c: c.varlen is not None and not c.causal
         and any(k == 0 for _, k in c.varlen.seqlens)),
        ("a sequence with no query", lambda c: c.varlen is not None and any(q == 0 for q, _ in c.varlen.seqlens)),
        ("a sequence with seqlen_q > seqlen_k", lambda c: c.varlen is not None
         and any(q > k for q, k in c.varlen.seqlens)),
        ("a tail", lambda c: c.varlen is not None and c.varlen.tail > 0),
        ("one sequence", lambda c: c.varlen is not None and len(c.varlen.seqlens) == 1),
        ("three sequences or more", lambda c: c.varlen is not None and len(c.varlen.seqlens) >= 3),
    ),
    "paged": (
        ("page size 1", lambda c: c.paged is not None and c.paged.page_size == 1),
        ("page size not a power of two", lambda c: c.paged is not None and not _power_of_two(c.paged.page_size)),
        ("an empty cache", lambda c: c.paged is not None and 0 in c.paged.cache_seqlens),
        ("one query", lambda c: c.kind == "paged" and c.seqlen_q == 1),
        ("several queries", lambda c: c.kind == "paged" and c.seqlen_q > 1),
    ) + tuple((f"pages {order}", lambda c, o=order: c.paged is not None and c.paged.pages == o)
              for order in ("reverse", "random", "shared")),
    "splits": (
        ("an empty split", lambda c: c.splits > 1 and any(lo == hi for _, k in c.sequences
                                                          for lo, hi in c.split_ranges(k))),
        ("splits of keys", lambda c: c.splits > 1 and any(k > 1 for _, k in c.sequences)),
    ),
    "shards": (
        ("an empty shard", lambda c: c.shards != "off" and any(not len(keys) for _, k in c.sequences
                                                              for keys in c.shard_keys(k))),
        ("interleaved shards", lambda c: c.shards == "interleaved"),
        ("contiguous shards", lambda c: c.shards == "contiguous"),
    ),
    "kv_shared": (
        ("v narrower than the k it shares", lambda c: c.kv_shared and c.dv < c.head_dim),
        ("K = V", lambda c: c.kv_shared and c.dv == c.head_dim),
    ),
    "mask": (
        ("a mask per batch element and head, several of each", lambda c: c.mask is not None
         and c.mask.shape == "full" and c.batch >= 2 and c.nheads >= 2),
        ("a mask broadcast over batch or heads", lambda c: c.mask is not None
         and c.mask.shape in ("batch", "heads", "shared")),
        ("a key mask", lambda c: c.mask is not None and c.mask.shape == "keys"),
        ("a mask that leaves rows without a key", lambda c: _mask_empties_rows(c)),
        ("a block mask with a tail block", lambda c: c.mask is not None and c.mask.pattern == "block"
         and bool(c.seqlen_q % c.mask.block or c.seqlen_k % c.mask.block)),
    ),
    "mask_nan": (("NaN keys", lambda c: c.mask is not None and c.mask.nan),),
    "bias": (
        ("a min bias", lambda c: _bias(c) == "min"),
        ("a large bias", lambda c: _bias(c) == "large"),
        ("a bias broadcast over batch or heads", lambda c: c.bias is not None and c.bias.shape != "full"),
        ("a min bias, batch or heads >= 2", lambda c: _bias(c) == "min" and max(c.batch, c.nheads) >= 2),
        ("a min bias broadcast over batch or heads", lambda c: _bias(c) == "min" and c.bias.shape != "full"),
        ("an fp32 bias", lambda c: c.bias is not None and c.bias.dtype == "fp32"),
    ),
    "bias_grad": (("the gradient of a broadcast bias", lambda c: c.bias is not None and c.bias.grad
                   and c.bias.shape != "full"),),
    "score_mod": tuple((f"{m} score_mod", lambda c, m=m: c.score_mod == m) for m in ("relative", "alibi",
                                                                                      "softcap")),
    "sparse": (
        ("invalid indices: -1 slots (rows of them alone) or past seqlen_k",
         lambda c: c.sparse is not None and c.sparse.indices in ("invalid", "out-of-range")),
        ("a key listed twice", lambda c: c.sparse is not None and c.sparse.indices == "duplicates"),
        ("one index a row, or more than the keys", lambda c: c.sparse is not None
         and (c.sparse.topk == 1 or c.sparse.topk > c.seqlen_k)),
    ),
    "lse_grad": (
        ("a loss on lse alone (dv exactly 0)", lambda c: c.lse_grad == "alone"),
        ("a loss on lse with rows that see no key", lambda c: c.lse_grad != "off" and _rows_without_key(c)),
        ("a loss on lse with sinks", lambda c: c.lse_grad != "off" and c.sinks != "off"),
    ),
}


def edges_of(case: Case) -> list:
    """'feature: edge' for each edge the case lies on."""
    return [f"{feature}: {name}" for feature, edges in EDGES.items() for name, on in edges if on(case)]


def listed(features: tuple) -> list:
    """'feature: edge' of every edge a draw of these features should reach (the shape's, and each feature's)."""
    return [f"{feature}: {name}" for feature in ("shape",) + tuple(features) for name, _ in EDGES.get(feature, ())]


def predicate(label: str) -> Callable[[Case], bool]:
    feature, _, name = label.partition(": ")
    return dict(EDGES[feature])[name]
