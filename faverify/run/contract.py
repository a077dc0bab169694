"""What a subject must return, checked before any judging: shapes, dtypes, devices and plain tensors, read
as the calling stream sees them; the NaN out buffer of a subject that writes into one."""
from __future__ import annotations

import torch

from faverify.cases.case import Case
from faverify.cases.margins import poisoned
from faverify.dtypes import TORCH


def out_buffer(case: Case, q: torch.Tensor) -> torch.Tensor:
    """A NaN buffer in NaN margins, of out's shape and dtype, for a subject that declares out_buffer."""
    return poisoned(expected_out_shape(case), TORCH[case.dtype], q.device)


def check_splits(case: Case, splits) -> str | None:
    want = split_shape(case)
    for name, t, shape in zip(("out_splits", "lse_splits"), splits, want):
        if plain(name, t):
            return plain(name, t)
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            return f"{name} has shape {tuple(getattr(t, 'shape', ()))}, expected {shape}"
    return None


def as_the_caller_sees(t):
    """A CUDA output as a caller reads it: copied on the current stream, before anything synchronizes the
    device. A kernel that writes its output on a stream of its own and returns without making the caller's
    stream wait gives a caller whatever the buffer held at that moment; the device-wide synchronize the
    metrics make would otherwise hide the race."""
    return t.clone() if isinstance(t, torch.Tensor) and t.is_cuda else t


def plain(name: str, t) -> str | None:
    """A subclass of torch.Tensor answers the judging's own operations as it likes (zeros whose subtraction
    and isnan say "equal" passed every check): faverify judges plain tensors only, and reads nothing of a
    subclass before refusing it."""
    if isinstance(t, torch.Tensor) and type(t) is not torch.Tensor:
        return (f"{name} is a {type(t).__module__}.{type(t).__qualname__}, a subclass of torch.Tensor: return "
                f"a plain tensor (faverify judges only those)")
    return None


def on_device(name: str, t, device: torch.device) -> str | None:
    if isinstance(t, torch.Tensor) and t.device != device:
        return f"{name} is on {t.device}, expected the inputs' device {device}"
    return None


def expected_out_shape(case: Case) -> tuple:
    """out's shape: [b, s, h, head_dim_v]; a varlen case's packed [total_q + tail, h, head_dim_v]."""
    if case.varlen is not None:
        return case.total_q + case.varlen.tail, case.nheads, case.dv
    return case.batch, case.seqlen_q, case.nheads, case.dv


def expected_lse_shape(case: Case) -> tuple:
    """lse's shape: [b, h, seqlen_q]; a varlen case's [h, total_q + tail] (flash-attn's)."""
    if case.varlen is not None:
        return case.nheads, case.total_q + case.varlen.tail
    return case.batch, case.nheads, case.seqlen_q


def check_outputs(case: Case, q: torch.Tensor, out, lse) -> str | None:
    """The calling convention (docs/design.md): out like q, on q's device, lse [b, h, seqlen_q] float32
    (varlen: packed, expected_out_shape)."""
    if not isinstance(out, torch.Tensor):
        return f"out is {type(out).__name__}, expected a tensor"
    problem = plain("out", out) or plain("lse", lse) or on_device("out", out, q.device) \
        or on_device("lse", lse, q.device)
    if problem:
        return problem
    want_out = expected_out_shape(case)
    if tuple(out.shape) != want_out:
        layout = "[total_q + tail, h, head_dim_v]" if case.kind == "varlen" else "[b, s, h, head_dim_v]"
        return f"out has shape {tuple(out.shape)}, expected {want_out} ({layout})"
    want_dtype = TORCH[case.dtype]  # the inputs' dtype, or an FP8 case's output dtype
    if out.dtype != want_dtype:
        if case.fp8 is not None:
            return f"out has dtype {out.dtype}, expected {want_dtype} (FP8 inputs give bf16 out)"
        return f"out has dtype {out.dtype}, expected the input dtype {want_dtype}"
    if lse is not None:
        want = expected_lse_shape(case)
        if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != want:
            layout = "[h, total_q + tail]" if case.kind == "varlen" else "[b, h, seqlen_q]"
            return f"lse has shape {tuple(getattr(lse, 'shape', ()))}, expected {want} ({layout})"
        if lse.dtype != torch.float32:
            return f"lse has dtype {lse.dtype}, expected torch.float32"
    return None


def check_max_logit(case: Case, q: torch.Tensor, max_logit, per: str) -> str | None:
    """The max logit asked for: a float32 tensor on q's device, [b, h, seqlen_q] per row or [h] per head
    (conventions.max_logit)."""
    if not isinstance(max_logit, torch.Tensor):
        return f"max_logit is {type(max_logit).__name__}, expected a tensor (the case asked for it)"
    problem = plain("max_logit", max_logit) or on_device("max_logit", max_logit, q.device)
    if problem:
        return problem
    want = (case.batch, case.nheads, case.seqlen_q) if per == "row" else (case.nheads,)
    if tuple(max_logit.shape) != want:
        layout = "[b, h, seqlen_q]" if per == "row" else "[h]"
        return f"max_logit has shape {tuple(max_logit.shape)}, expected {want} ({layout}, one per {per})"
    if max_logit.dtype != torch.float32:
        return f"max_logit has dtype {max_logit.dtype}, expected torch.float32"
    return None


def split_shape(case: Case) -> tuple:
    """(out_splits', lse_splits' shape): [splits] before out's and lse's own, packed for a varlen case."""
    return (case.splits, *expected_out_shape(case)), (case.splits, *expected_lse_shape(case))


# What the second buffer holds: a finite value no output element ends up as by chance where the first
# call left NaN (unwritten)
SENTINEL = -3.0e3


def unwritten(case: Case, first, second, rows: int) -> str | None:
    """Where the first call's out (into a NaN buffer) is NaN and the second's (into a SENTINEL buffer) is the
    sentinel, the kernel wrote nothing; in words, of the first `rows` token rows, or None."""
    fill = torch.tensor(SENTINEL, dtype=second.dtype, device=second.device)
    never = torch.isnan(first) & (second == fill)
    # a row a token: varlen's packed [total + tail, h, dv] to its first `rows`; dense [b, sq, h, dv] whole
    never = never.reshape(first.shape[0], -1)[:rows] if case.kind == "varlen" else never.flatten(0, 1).flatten(1)
    where = never.any(dim=1).nonzero().flatten().tolist()
    if not where:
        return None
    if case.kind == "varlen":
        starts, label = [0], "sequence"
        for s, _ in case.varlen.seqlens:
            starts.append(starts[-1] + s)
    else:
        starts, label = list(range(0, case.batch * case.seqlen_q + 1, case.seqlen_q)), "batch entry"
    owner = next(i for i in range(len(starts) - 1) if starts[i] <= where[0] < starts[i + 1])
    mine = [r - starts[owner] for r in where if starts[owner] <= r < starts[owner + 1]]
    others = len({i for r in where for i in range(len(starts) - 1) if starts[i] <= r < starts[i + 1]}) - 1
    return (f"{int(never.sum())} elements of the out buffer never written: rows {mine[0]}..{mine[-1]} of {label} "
            f"{owner}" + (f" and rows of {others} more" if others else ""))
