"""What a subject's call leaves behind: inputs it changed in place, and outputs that differ in any bit when
the call repeats (the determinism check of --repeat)."""
from __future__ import annotations

import torch

from faverify.cases.case import Case
from faverify.cases.inputs import EXTRAS, Inputs, lay_out
from faverify.subjects.base import Subject


def differences(subject: Subject, case: Case, pristine: Inputs, got: dict, backward: bool, repeat: int) -> list:
    """Run the subject again (repeat - 1 times) on fresh copies of the same inputs and compare every tensor
    bit for bit with the first run: (signature, reason) for the first run that differs."""
    for run in range(2, repeat + 1):
        x = lay_out(case, pristine, requires_grad=backward)
        out, lse = subject(x.q, x.k, x.v, case, x.extras())
        again = {"out": out, "lse": lse}
        if backward and out.requires_grad:
            wrt = x.differentiable()
            again.update(zip(wrt, torch.autograd.grad(out, tuple(wrt.values()), x.dout, allow_unused=True)))
        counts = {name: _bits_differ(got[name], t) for name, t in again.items()
                  if got.get(name) is not None and t is not None}
        differ = [f"{name} in {n} elements" for name, n in counts.items() if n]
        if differ:
            return [("nondeterministic", f"run {run} of {repeat} differs from run 1: " + ", ".join(differ))]
    return []


def _bits_differ(a: torch.Tensor, b: torch.Tensor) -> int:
    if a.shape != b.shape or a.dtype != b.dtype:
        return max(a.numel(), b.numel())
    a, b = a.detach().contiguous(), b.detach().contiguous()
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return int((a.view(bits) != b.view(bits)).sum())


def copy_inputs(x: Inputs, backward: bool) -> Inputs:
    """The inputs as they are before the subject runs. The reference and the baseline are computed from
    this copy, so a subject that changes its inputs in place cannot move the yardstick it is judged by."""
    return x.copy(dout=backward)


def changed_inputs(x: Inputs, pristine: Inputs, writes: tuple) -> list:
    """(signature, reason) for each input the subject changed and was not declared to write
    (Capabilities.writes): ("q:modified", "modified q in place: 4096 elements"). q, k, v, dout and every
    tensor passed beside them (sinks, slopes, masks, biases, indices, page tables, descales): a kernel that
    writes into the fixed sink or the block table leaves the next call other inputs than its caller gave.
    NaN stays NaN. One host transfer for all of them."""
    names = [n for n in ("q", "k", "v", "dout") + EXTRAS if n not in writes
             and isinstance(getattr(x, n), torch.Tensor) and getattr(pristine, n) is not getattr(x, n)]
    if not names:
        return []
    counts = [changed_elements(getattr(x, n).detach(), getattr(pristine, n)) for n in names]
    return [(f"{n}:modified", f"modified {n} in place: {int(c)} elements")
            for n, c in zip(names, torch.stack(counts).tolist()) if c]


def changed_elements(now: torch.Tensor, before: torch.Tensor, chunk: int = 1 << 26) -> torch.Tensor:
    """How many elements of `now` differ from `before` (NaN equal to NaN), as a tensor on their device.
    Counted in slices along dim 0 of at most about `chunk` elements: the comparison's temporaries are four
    tensors of the compared size, and a paged pool of 4e9 elements (GPU limits) took faverify itself out
    of memory (32 GiB asked for on the H200) where its slices take a few hundred MiB."""
    total = torch.zeros((), dtype=torch.int64, device=now.device)
    if now.dim() == 0:
        now, before = now.reshape(1), before.reshape(1)
    rows = max(1, chunk // max(1, now[0].numel())) if now.shape[0] else 1
    for i in range(0, now.shape[0], rows):
        a, b = now[i:i + rows], before[i:i + rows]
        total += ((a != b) & ~(torch.isnan(a) & torch.isnan(b))).sum()
    return total
