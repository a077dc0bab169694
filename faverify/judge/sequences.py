"""The FP64 reference and the naive baseline of a ragged case, one sequence at a time, and of split-KV
partial results, in the form the metrics judge (docs/design.md, "Ragged and paged"):

- varlen: one packed batch, [1, total, ...] (lse [1, h, total_q]); the tail is not judged;
- paged: [batch, seqlen_q, ...], sequence b against its own cache_seqlens[b] keys;
- splits: [splits * batch, seqlen_q, ...], split s of sequence b the attention over its key range, or
  over its context-parallel shard's keys (Case.shard_keys).

Each sequence is its own dense problem: its masks align to its own lengths, under the subject's
conventions. The rows a judged tensor's reference leaves without a key (lse -inf) are returned as a mask.
"""
from __future__ import annotations

import dataclasses

import torch

from faverify.cases.case import Case
from faverify.cases.conventions import Conventions
from faverify.cases.ragged import offsets, unpack
from faverify.cases.variant import Variant
from faverify.judge.reference import naive, reference

# a scale is the largest of its sequences', except dsinks': every sequence's rows add into one gradient
_SUMMED_SCALES = ("dsinks",)


def _variant(case: Case, x, conventions: Conventions, b: int | None, sq: int, sk: int, lo: int = 0) -> Variant:
    """Sequence b's variant (None: the whole dense batch), over the keys from lo on."""
    left, right = case.bounds
    slopes = x.alibi_slopes
    if slopes is not None and slopes.dim() == 2 and b is not None:
        slopes = slopes[b:b + 1]
    return Variant(left=left, right=right, softcap=case.softcap, alibi_slopes=slopes,
                   sinks=None if x.sinks is None else x.sinks.detach(),
                   offset=conventions.offset(sq, sk) - lo, alibi_form=conventions.alibi)


def per_sequence(case: Case, x) -> list:
    """(b, q, k, v, dout) of each sequence with query rows, [1, s, ...] (b None: the dense batch whole)."""
    q, k, v = (t.detach() for t in x.tensors())
    if case.kind == "dense":
        return [(None, q, k, v, x.dout)]
    out = []
    ends_q, ends_k = (offsets(case, side) for side in (0, 1)) if case.kind == "varlen" else ((), ())
    for b, (sq, sk) in enumerate(case.sequences):
        if case.kind == "varlen":
            parts = (unpack(q, ends_q, b), unpack(k, ends_k, b), unpack(v, ends_k, b), unpack(x.dout, ends_q, b))
        else:
            parts = (q[b:b + 1], x.k_logical[b:b + 1, :sk], x.v_logical[b:b + 1, :sk], x.dout[b:b + 1])
        out.append((b, *parts))
    return out


def yardsticks(case: Case, x, backward: bool, conventions: Conventions) -> tuple:
    """(reference tensors, scales, baseline tensors, rows without a key [B, h, S]) of a ragged case."""
    refs, scales, bases = [], [], []
    for b, q, k, v, dout in per_sequence(case, x):
        sq, sk = q.shape[1], k.shape[1]
        if sq == 0:  # no query rows: its keys get no gradient
            refs.append(_no_rows(k, v, torch.float64, backward))
            bases.append(_no_rows(k, v, q.dtype, backward))
            continue
        variant = _variant(case, x, conventions, b, sq, sk)
        d = dout if backward else None
        ref, sc = reference(q, k, v, d, causal=case.causal, scale=case.scale, variant=variant)
        refs.append(ref)
        scales.append(sc)
        bases.append(naive(q, k, v, d, causal=case.causal, scale=case.scale, variant=variant))
    axis = {"out": 1, "lse": 2, "dq": 1, "dk": 1, "dv": 1} if case.kind == "varlen" else \
        {"out": 0, "lse": 0, "dq": 0, "dk": 0, "dv": 0}
    ref, base = _joined(refs, axis), _joined(bases, axis)
    return ref, _combined(scales), base, ref["lse"] == float("-inf")


def split_yardsticks(case: Case, x, conventions: Conventions, block: int) -> tuple:
    """(reference, scales, baseline, rows without a key) of the split-KV partials: split s of sequence b over
    keys Case.split_ranges(sk_b, block)[s]; out [S * B, sq, h, dv] and lse [S * B, h, sq], a varlen case's
    packed per split, out [S, total_q, h, dv] and lse [S, h, total_q]."""
    if case.shards != "off":
        return _shard_yardsticks(case, x, conventions)
    varlen = case.kind == "varlen"
    refs, scales, bases = [], [], []
    for s in range(case.splits):
        split_refs, split_bases = [], []
        for b, q, k, v, _ in per_sequence(case, x):
            sk = k.shape[1]
            if q.shape[1] == 0:  # no query rows: nothing in out or lse
                continue
            lo, hi = case.split_ranges(sk, block)[s]
            variant = _variant(case, x, conventions, b, q.shape[1], sk, lo)
            args = (q, k[:, lo:hi], v[:, lo:hi])
            ref, sc = reference(*args, causal=case.causal, scale=case.scale, variant=variant)
            split_refs.append(ref)
            scales.append(sc)
            split_bases.append(naive(*args, causal=case.causal, scale=case.scale, variant=variant))
        within = {"out": 1, "lse": 2} if varlen else {"out": 0, "lse": 0}
        refs.append(_joined(split_refs, within))
        bases.append(_joined(split_bases, within))
    axis = {"out": 0, "lse": 0}
    ref = _joined(refs, axis)
    return ref, _combined(scales), _joined(bases, axis), ref["lse"] == float("-inf")


def _shard_yardsticks(case: Case, x, conventions: Conventions) -> tuple:
    """split_yardsticks of a dense case cut into context-parallel shards (Case.shard_keys): shard s is the
    attention of every query over the keys of shard s alone, at their own positions (causal, windows and
    ALiBi as in the whole), computed apart as a shard's call is; a row that sees none of them gives 0, -inf."""
    q, k, v = (t.detach() for t in x.tensors())
    whole = _variant(case, x, conventions, None, q.shape[1], k.shape[1])
    refs, scales, bases = [], [], []
    for keys in case.shard_keys(k.shape[1]):
        keep = torch.zeros(1, 1, 1, k.shape[1], dtype=torch.bool, device=k.device)
        keep[..., keys.start:keys.stop:keys.step] = True
        variant = dataclasses.replace(whole, mask=keep)
        ref, sc = reference(q, k, v, causal=case.causal, scale=case.scale, variant=variant)
        refs.append(ref)
        scales.append(sc)
        bases.append(naive(q, k, v, causal=case.causal, scale=case.scale, variant=variant))
    axis = {"out": 0, "lse": 0}
    ref = _joined(refs, axis)
    return ref, _combined(scales), _joined(bases, axis), ref["lse"] == float("-inf")


def _no_rows(k, v, dtype, backward: bool) -> dict:
    """A sequence without query rows: nothing to judge but its keys' gradients, which are 0."""
    b, sk, hk, d = k.shape
    return {"dk": torch.zeros(b, sk, hk, d, dtype=dtype, device=k.device),
            "dv": torch.zeros(b, sk, hk, v.shape[3], dtype=dtype, device=k.device)} if backward else {}


def _joined(parts: list, axis: dict) -> dict:
    """Each tensor's parts along its token (varlen) or batch axis; dsinks summed."""
    out = {}
    for name in dict.fromkeys(n for p in parts for n in p):
        have = [p[name] for p in parts if name in p]
        if name == "dsinks":
            out[name] = torch.stack([t.to(torch.float64) for t in have]).sum(0).to(have[0].dtype)
        else:
            out[name] = torch.cat(have, dim=axis[name])
    return out


def _combined(scales: list) -> dict:
    out = {}
    for name in scales[0]:
        values = torch.stack([s[name].to(torch.float64) for s in scales])
        out[name] = values.sum() if name in _SUMMED_SCALES else values.amax()
    return out
