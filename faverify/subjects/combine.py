"""`combine`: the split-KV combine formula (cases/splits.py) as a subject, in fp32 as kernels run it.

A combine is called as fn(out_splits, lse_splits) -> (out, lse) on the partial results of a split case
(out_splits [splits, b, sq, h, dv], lse_splits [splits, b, h, sq], float32, natural log; an empty
partial is (0, -inf)); what it returns is judged against the whole attention. The partials are split-KV
ranges, or context-parallel shards (Case.shards: contiguous or interleaved keys, some shards empty), each
computed by a call of its own. A user's combine kernel is checked the same way when it declares
{"combine": True} in faverify_capabilities, and on shards with {"shards": True} too.
"""
from __future__ import annotations

from faverify.subjects.base import Capabilities, Subject

# the features whose partials a combine sees: any case but a varlen one or with sinks
CAPS = Capabilities.of(combine=True, splits=True, shards=True, backward=False, lse=True, window=True, softcap=True,
                       alibi=True, head_dim_v=True, paged=True, max_head_dim=512)


def combine(out_splits, lse_splits):
    from faverify.cases.splits import combine as formula
    return formula(out_splits.float(), lse_splits.float())


def make() -> Subject:
    return Subject(name="combine", fn=combine, caps=CAPS,
                   description="the split-KV combine formula in fp32 (judged on split cases' partials)")
