"""Relations between calls that a subject promises (Capabilities.relations), checked bit for bit.

batch: each batch entry of a dense case, computed alone, gives its row of the batched call: out and lse,
and dq (dk and dv too where k and v are not shared across the batch). A row that depends on its batch
mates or on the batch size breaks it: a reduction whose order follows the batch, a cache keyed by the
batched shape. Cases it cannot cut into entries (ragged, masked, biased, one entry) are not checked.
"""
from __future__ import annotations

import dataclasses

import torch

from faverify.cases.case import Case
from faverify.cases.inputs import Inputs, lay_out
from faverify.subjects.base import Subject


def batch_checkable(case: Case) -> bool:
    return (case.kind == "dense" and case.batch > 1 and case.mask == "off" and case.bias == "off"
            and case.score_mod == "off")


def batch_relation(subject: Subject, case: Case, pristine: Inputs, got: dict, backward: bool) -> dict:
    """{"checked": 1, "equal": bool, "max_diff": float, "where": str} for a case it can cut, else
    {"checked": 0}."""
    if not batch_checkable(case):
        return {"checked": 0}
    alone = dataclasses.replace(case, batch=1)
    worst, where = 0.0, ""
    for b in range(case.batch):
        x = lay_out(case, pristine, requires_grad=backward)
        q, k, v = (t[b:b + 1] for t in x.tensors())
        extras = dict(x.extras())
        if extras.get("alibi_slopes") is not None and extras["alibi_slopes"].dim() == 2:
            extras["alibi_slopes"] = extras["alibi_slopes"][b:b + 1]
        out, lse = subject(q, k, v, alone, extras)
        mine = {"out": out, "lse": lse}
        if backward and out.requires_grad:
            names = ("dq",) if case.layout == "broadcast" else ("dq", "dk", "dv")  # shared k, v: summed over b
            grads = torch.autograd.grad(out, tuple({"dq": q, "dk": k, "dv": v}[n] for n in names),
                                        x.dout[b:b + 1], allow_unused=True)
            mine.update(zip(names, grads))
        for name, t in mine.items():
            row = got.get(name)
            if t is None or row is None:
                continue
            row = row[b:b + 1]
            if t.shape != row.shape or not torch.equal(t.detach(), row.detach()):
                diff = float((t.detach().double() - row.detach().double()).abs().nan_to_num(float("inf")).max()) \
                    if t.shape == row.shape else float("inf")
                if diff >= worst:
                    worst, where = diff, f"{name} of batch entry {b}"
    return {"checked": 1, "equal": not where, "max_diff": worst, "where": where}
