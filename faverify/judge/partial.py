"""A large case judged on part of its batch (docs/design.md, "Offsets past 2^31"): the batch entries around
each boundary its offsets cross (cases/large.judged_entries), taken out as a case of their own. Each entry
is its own problem (every query row sees its own entry's keys alone, and an entry's keys are seen by its
own rows alone), so the FP64 reference and the baseline of those entries are the whole case's on them: out,
lse and dq of their rows, dk and dv of their keys. The other entries are not read back."""
from __future__ import annotations

import dataclasses

import torch

from faverify.cases.case import Case
from faverify.cases.inputs import Inputs


def narrowed(case: Case, x: Inputs, got: dict, entries: tuple) -> tuple:
    """(the case of those entries alone, their inputs, the subject's tensors on them). judged_entries
    takes no case with a feature, so q, k, v and dO are all the inputs there are."""
    index = torch.tensor(entries, device=x.q.device)

    def pick(t):
        return None if t is None else t.detach().index_select(0, index.to(t.device))
    part = dataclasses.replace(x, q=pick(x.q), k=pick(x.k), v=pick(x.v), dout=pick(x.dout))
    return dataclasses.replace(case, batch=len(entries)), part, {name: pick(t) for name, t in got.items()}


def renumbered(metrics: dict, entries: tuple, batch: int, boundary: int) -> dict:
    """The metrics of the entries judged, their worst index in the whole batch's numbering, and a failing
    tensor's reason saying which entries were read back."""
    past = f"2^{boundary.bit_length() - 1}" if boundary & (boundary - 1) == 0 else str(boundary)
    read = ", ".join(map(str, entries))
    for m in metrics.values():
        if m.worst_index:
            m.worst_index = [entries[m.worst_index[0]], *m.worst_index[1:]]
        if not m.passed:
            m.reason += f" (read back: batch entries {read} of {batch}, around the offsets past {past})"
    return metrics
