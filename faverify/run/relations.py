"""Relations between calls that a subject promises (Capabilities.relations), checked value for value: every
element equal, -0.0 beside +0.0 and NaN beside NaN counted the same (a row computed alone may round a zero
to the other sign; a NaN is the judge's to fail, not the relation's).

batch: each batch entry of a dense case, computed alone, gives its row of the batched call: out and lse,
and dq (dk and dv too where k and v are not shared across the batch). A row that depends on its batch
mates or on the batch size breaks it: a reduction whose order follows the batch, a cache keyed by the
batched shape.

decode: the last query row of a call, computed alone against the same keys (a decode step, bottom-right
aligned as every call is), gives that row of the call: out, lse and its dq. A decode path that sums in
another order than the prefill path breaks it.

repeat: the same call again, on fresh copies of the same inputs, gives the same bits: every tensor. An
atomic reduction whose order varies from run to run breaks it (`--repeat N` fails any difference over N
runs on every subject).

splits: a split-KV call with its case's N splits gives the bits of the same call with one split (out and
lse). A subject that promises it combines its partials so; one that does not is measured, its difference
judged against FP64 on each call alone as always.

A case a relation cannot cut (ragged, masked, biased, one entry or one row, no splits) is not checked.
"""
from __future__ import annotations

import dataclasses

import torch

from faverify.cases.case import Case
from faverify.cases.inputs import Inputs, lay_out
from faverify.subjects.base import Subject


def _plain(case: Case) -> bool:
    return case.kind == "dense" and case.mask is None and case.bias is None and case.score_mod == "off"


def batch_relation(subject: Subject, case: Case, pristine: Inputs, got: dict, backward: bool) -> dict:
    """{"checked": 1, "equal": bool, "max_diff": float (relative), "where": str} for a case it can cut, else
    {"checked": 0}."""
    if not (_plain(case) and case.batch > 1):
        return {"checked": 0}
    alone = dataclasses.replace(case, batch=1)
    worst, where = 0.0, ""
    for b in range(case.batch):
        x = lay_out(case, pristine, requires_grad=backward)
        q, k, v = (t[b:b + 1] for t in x.tensors())
        extras = dict(x.extras())
        if extras.get("alibi_slopes") is not None and extras["alibi_slopes"].dim() == 2:
            extras["alibi_slopes"] = extras["alibi_slopes"][b:b + 1]
        names = ("dq",) if case.layout == "broadcast" else ("dq", "dk", "dv")  # shared k, v: summed over b
        mine = _call(subject, alone, (q, k, v), extras, x.dout[b:b + 1] if backward else None, names)
        rows = {"out": got["out"][b:b + 1], "lse": _rows(got.get("lse"), slice(b, b + 1), 0),
                **{n: got[n][b:b + 1] for n in names if got.get(n) is not None}}
        worst, where = _worse((worst, where), _differ(mine, rows), f"batch entry {b}")
    return {"checked": 1, "equal": not where, "max_diff": worst, "where": where}


def decode_relation(subject: Subject, case: Case, pristine: Inputs, got: dict, backward: bool) -> dict:
    """The last query row alone against the same keys; as batch_relation."""
    if not (_plain(case) and case.seqlen_q > 1):
        return {"checked": 0}
    x = lay_out(case, pristine, requires_grad=backward)
    q = x.q[:, -1:]
    mine = _call(subject, dataclasses.replace(case, seqlen_q=1), (q, x.k, x.v), x.extras(),
                 x.dout[:, -1:] if backward else None, ("dq",))
    rows = {"out": got["out"][:, -1:], "lse": _rows(got.get("lse"), slice(-1, None), 2),
            **({"dq": got["dq"][:, -1:]} if got.get("dq") is not None else {})}
    worst, where = _worse((0.0, ""), _differ(mine, rows), "the last query row")
    return {"checked": 1, "equal": not where, "max_diff": worst, "where": where}


def repeat_relation(subject: Subject, case: Case, pristine: Inputs, got: dict, backward: bool) -> dict:
    """The same call again; as batch_relation."""
    x = lay_out(case, pristine, requires_grad=backward)
    wrt = x.differentiable() if backward else {}
    out, lse = subject(x.q, x.k, x.v, case, x.extras())
    mine = {"out": out, "lse": lse}
    if wrt and out.requires_grad:
        mine.update(zip(wrt, torch.autograd.grad(out, tuple(wrt.values()), x.dout, allow_unused=True)))
    worst, where = _worse((0.0, ""), _differ(mine, got), "the second call")
    return {"checked": 1, "equal": not where, "max_diff": worst, "where": where}


def splits_relation(subject: Subject, case: Case, pristine: Inputs, got: dict, backward: bool) -> dict:
    """The call with one split against the case's; as batch_relation. Forward only: splits are a decode's."""
    if case.splits < 2 or not subject.caps.ragged.splits:
        return {"checked": 0}
    one = dataclasses.replace(case, splits=1)
    x = lay_out(case, pristine, requires_grad=False)
    with torch.no_grad():
        out, lse = subject(x.q, x.k, x.v, one, x.extras())
    worst, where = _worse((0.0, ""), _differ({"out": out, "lse": lse}, got), "one split")
    return {"checked": 1, "equal": not where, "max_diff": worst, "where": where}


RELATION_CHECKS = {"batch": batch_relation, "decode": decode_relation, "repeat": repeat_relation,
                   "splits": splits_relation}


def _call(subject: Subject, case: Case, qkv: tuple, extras: dict, dout, names: tuple) -> dict:
    """The subject's out and lse on these views, and (given dout) its gradients named `names` with respect
    to them (views of the case's leaves: the gradient of each view)."""
    out, lse = subject(*qkv, case, extras)
    mine = {"out": out, "lse": lse}
    if dout is not None and out.requires_grad:
        wrt = dict(zip(("dq", "dk", "dv"), qkv))
        mine.update(zip(names, torch.autograd.grad(out, tuple(wrt[n] for n in names), dout, allow_unused=True)))
    return mine


def _rows(t, rows: slice, dim: int):
    return None if t is None else t[(slice(None),) * dim + (rows,)]


def _differ(mine: dict, rows: dict) -> tuple:
    """(largest difference relative to the tensor's largest magnitude, the tensor it is in) over the tensors
    both have whose values differ; (0.0, "") where every one is the same."""
    worst, where = 0.0, ""
    for name, t in mine.items():
        row = rows.get(name)
        if t is None or row is None:
            continue
        t, row = t.detach(), row.detach()
        if t.shape != row.shape:
            return float("inf"), name
        differing = ~_same_values(t, row)
        if differing.any():
            # relative to the row's largest magnitude: a last-bit difference of values near 1e5 is not large
            scale = float(row.double().abs().nan_to_num(0.0).max()) or 1.0
            gap = (t.double() - row.double()).abs().nan_to_num(float("inf"))
            diff = float(gap[differing].max()) / scale
            if not where or diff > worst:
                worst, where = diff, name
    return worst, where


def _same_values(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Where two tensors hold the same values: == counts -0.0 equal to +0.0, and a NaN beside a NaN is counted
    the same whatever its payload (a kernel that gives NaN on both calls keeps its promise)."""
    if not a.is_floating_point():
        return a == b
    return (a == b) | (a.isnan() & b.isnan())


def _worse(found: tuple, new: tuple, place: str) -> tuple:
    """The larger of two (difference, where) findings, the new one's place named."""
    if new[1] and (not found[1] or new[0] > found[0]):
        return new[0], f"{new[1]} of {place}"
    return found
