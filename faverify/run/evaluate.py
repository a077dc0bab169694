"""Evaluate one case on one subject: inputs -> subject -> FP64 reference and baseline -> metrics -> verdict.

evaluate() never raises for anything the subject does: an unsupported case is a skip with the reason,
any other exception in the subject is a failing case with its message. Only our own bugs propagate.
"""
from __future__ import annotations

import contextlib
import math
import os
import posix
import time

import torch

from faverify.cases.case import Case
from faverify.cases.conventions import DEFAULT as DEFAULT_CONVENTIONS
from faverify.cases.conventions import Conventions
from faverify.cases.inputs import Inputs, make_inputs, variant_of
from faverify.errors import Unsupported
from faverify.judge.metrics import error_stats
from faverify.judge.reference import naive, reference
from faverify.judge.verdict import FLUSHED, Tolerance, judge_all, kind
from faverify.reports.case_result import CaseResult, failure
from faverify.subjects.base import Subject

MODES = {"fwd": ("out", "lse"), "bwd": ("dq", "dk", "dv", "dsinks", "dbias"),
         "both": ("out", "lse", "dq", "dk", "dv", "dsinks", "dbias")}


def evaluate(subject: Subject, case: Case, device: torch.device | str, *, mode: str = "both",
             tolerance: Tolerance | None = None, gradcheck: bool = False, stored=None,
             in_worker: bool = False, repeat: int = 1, tell=None) -> CaseResult:
    """tell(phase): called with "judging" once the subject's own calls of the case are done and faverify's
    judging begins, and with "subject" before the gradient check calls it again (a worker tells its parent,
    whose timeout is the subject's alone: isolation.py).
    stored: (inputs, reference, scales) from a golden file instead of drawing from the seed and
    computing the reference here (golden.py). in_worker: this process is a worker (isolation.py), where
    Ctrl-C is ignored, so a KeyboardInterrupt is the subject's own and fails its case; in the user's
    process it stops the run. repeat: run the subject that many times on the same inputs; a case whose
    outputs differ in any bit fails as "nondeterministic"."""
    device = torch.device(device)
    tolerance = tolerance or Tolerance()
    start = time.perf_counter()
    clock = _Clock(device, tell)
    subject.take_paths()  # whatever ran (or compiled: a warm-up) before this case is not its
    subject.take_compile_seconds()
    result = _evaluate(subject, case, device, mode, tolerance, clock, stored, in_worker, repeat)
    if gives_back(case, device):
        torch.cuda.empty_cache()
    result.paths = subject.take_paths()
    compiling = subject.take_compile_seconds()
    if compiling:  # the compiler's time (or the JIT cache's), not the kernel's: phases of their own
        clock.laps.update(compiling)
        clock.laps["subject"] = max(0.0, clock.laps.get("subject", 0.0) - sum(compiling.values()))
    if gradcheck and result.status == "pass":
        from faverify.judge.gradcheck import directional
        clock.tell("subject")
        result.gradcheck = directional(subject, case, device).to_dict()
        clock.lap("gradcheck")
        if not result.gradcheck["passed"] and not result.gradcheck["skipped"]:
            result.status = "fail"
            result.reason = "gradient check: " + result.gradcheck["reason"]
            error = result.gradcheck.get("error")
            result.signatures = [f"gradcheck:error:{error}" if error else "gradcheck"]
    result.seconds = time.perf_counter() - start
    result.phases = clock.laps
    result.device = str(device)
    return result


def exercise(subject: Subject, case: Case, device: torch.device | str, mode: str = "both") -> None:
    """Run the subject on a case without judging it (forward, and backward unless mode is fwd): the fuzz
    warm-up, which only wants what the case compiles. The subject's exceptions propagate."""
    device = torch.device(device)
    if subject.unsupported(case, device) is not None:
        return
    x = make_inputs(case, device, requires_grad=mode != "fwd")
    out, _ = subject(x.q, x.k, x.v, case, x.extras())
    if mode != "fwd" and subject.caps.backward and out.requires_grad:
        torch.autograd.grad(out, tuple(x.differentiable().values()), x.dout, allow_unused=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Clock:
    """Wall time per phase of a case; synchronizes the GPU at each lap so kernels are charged to their
    phase (the case ends in a device-to-host copy anyway)."""

    def __init__(self, device: torch.device, tell=None):
        self.tell = tell or (lambda phase: None)
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *a: None)
        self.device = device
        self.laps: dict = {}
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        self.sync(self.device)
        now = time.perf_counter()
        self.laps[name] = self.laps.get(name, 0.0) + now - self.t
        self.t = now


def _evaluate(subject: Subject, case: Case, device: torch.device, mode: str, tolerance: Tolerance,
              clock: _Clock, stored, in_worker: bool, repeat: int = 1) -> CaseResult:
    """in_worker: a KeyboardInterrupt in the subject is its own (evaluate says why). Whatever the subject
    raises fails its case (_subject_code); what faverify's own code raises propagates."""
    name = subject.name
    reason = subject.unsupported(case, device)
    backward = mode != "fwd" and not subject.caps.combine  # a combine has no gradients to ask
    if reason is None and mode == "bwd" and subject.caps.combine:
        reason = "a split-KV combine has no backward"
    judged_on_less = ""  # why a case asked for its backward is judged on its forward alone
    if reason is None and case.kind == "paged" and backward:
        if mode == "bwd":
            reason = PAGED_FORWARD
        mode, backward, judged_on_less = "fwd", False, PAGED_FORWARD_ONLY
    if reason is None and backward and not subject.caps.backward:
        if mode == "bwd":
            reason = NO_BACKWARD
        mode, backward, judged_on_less = "fwd", False, NO_BACKWARD_ONLY
    if reason is None:
        reason = _too_big(case, device, backward)
    if reason:
        return CaseResult(name, case, "skip", reason)
    if subject.caps.combine:
        return _evaluate_combine(subject, case, device, tolerance, clock, in_worker)

    try:
        if stored is None:
            x, reference_given = make_inputs(case, device, requires_grad=backward), None
        else:
            from faverify.cases.inputs import lay_out
            x, reference_given = lay_out(case, stored[0], requires_grad=backward), stored[1:]
        pristine = _copy(x, backward)
    except (MemoryError, torch.OutOfMemoryError) as e:  # faverify's side: workers beside this one took it
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
        return CaseResult(name, case, "skip", f"out of memory making the inputs ({type(e).__name__})")
    buffer = _out_buffer(case, x.q) if subject.caps.out_buffer else None
    clock.lap("inputs")
    try:
        with _subject_code(in_worker, skips=True):
            out, lse, splits = subject.call(x.q, x.k, x.v, case, x.extras(), out=buffer)
    except (Unsupported, ValueError, NotImplementedError) as e:
        return CaseResult(name, case, "skip", f"{type(e).__name__}: {e}")
    except SubjectRaised as e:  # the subject's failure, recorded with its message
        return failure(name, case, "fail", f"forward raised {e}", f"error:{e.name}")
    problem = _check_outputs(case, x.q, out, lse) or (_check_splits(case, splits) if splits is not None else None)
    if problem is None and subject.caps.lse and lse is None:
        problem = "the subject declares lse: true but returned out alone (return (out, lse))"
    if problem:
        return failure(name, case, "fail", problem, "contract")

    out, lse = _as_the_caller_sees(out), _as_the_caller_sees(lse)
    got = {"out": out, "lse": lse}
    forward_only = judged_on_less
    if backward and not out.requires_grad:  # judged on its forward alone, and the case says so
        forward_only, backward = FORWARD_ONLY, False
        mode = "fwd"
    if backward:
        try:
            with _subject_code(in_worker):
                wrt = x.differentiable()
                grads = torch.autograd.grad(out, tuple(wrt.values()), x.dout, allow_unused=True)
        except SubjectRaised as e:  # autograd's own complaint may come from an input changed in place
            failing = _changed_inputs(x, pristine, subject.caps.writes)
            failing.append((f"error:{e.name}", f"backward raised {e}"))
            return CaseResult(name, case, "fail", "; ".join(r for _, r in failing), signatures=[s for s, _ in failing])
        names = tuple(wrt)
        for gname, grad, inp in zip(names, grads, wrt.values()):
            got[gname] = grad if grad is not None else torch.zeros_like(inp)
        problem = next((p for g in names if (p := _plain(g, got[g]) or _on_device(g, got[g], x.q.device))), None)
        if problem:
            return failure(name, case, "fail", problem, "contract")
        got.update({g: _as_the_caller_sees(got[g]) for g in names})
    failing = _changed_inputs(x, pristine, subject.caps.writes)
    if backward:
        from faverify.cases.ragged import tail_gradients
        failing += tail_gradients(case, got, subject.caps.varlen_tail_grads)
    if buffer is not None:
        from faverify.cases.margins import written_outside
        rows = case.total_q if case.kind == "varlen" else buffer.shape[0]
        written = written_outside(buffer, rows)
        if written:
            failing.append(("out:written-outside", f"wrote {written} elements of the out buffer outside the "
                                                  "sequences' tokens (its tail or its margins)"))
    clock.lap("subject")
    if repeat > 1:
        try:
            with _subject_code(in_worker):
                failing += _differences(subject, case, pristine, got, backward, repeat)
        except SubjectRaised as e:
            failing.append((f"error:{e.name}", f"a repeated run raised {e}"))
        clock.lap("repeat")
    clock.tell("judging")
    try:
        metrics = judge(case, pristine, got, tolerance, MODES[mode], reference_given, subject.caps.conventions,
                        lap=clock.lap)
        if splits is not None:
            metrics.update(judge_splits(case, pristine, splits, tolerance, subject.caps, lap=clock.lap))
    except (MemoryError, torch.OutOfMemoryError) as e:  # faverify's side ran out, not the subject's
        return CaseResult(name, case, "skip", f"out of memory computing the FP64 reference ({type(e).__name__})")
    clock.lap("metrics")
    failing += [(f"{t}:{kind(m)}", f"{t}: {m.reason}") for t, m in metrics.items() if not m.passed]
    if failing:
        return CaseResult(name, case, "fail", "; ".join(r for _, r in failing), metrics, [sig for sig, _ in failing])
    return CaseResult(name, case, "pass", forward_only, metrics)


# The skips for memory (out of memory making a case's inputs or its reference, or too large for what was
# free): on a GPU shared with other workers they say what those held at the time, not what the case needs
# the reason a passing case carries when only its forward could be judged
FORWARD_ONLY = "forward only: the subject's output has no autograd graph, so its backward was not run"
PAGED_FORWARD = "paged cases are judged on the forward (decode kernels are forward-only)"
PAGED_FORWARD_ONLY = "forward only: " + PAGED_FORWARD
NO_BACKWARD = "the subject declares no backward (backward: false): judge it with --mode fwd"
NO_BACKWARD_ONLY = "forward only: the subject declares no backward (backward: false)"


def _out_buffer(case: Case, q: torch.Tensor) -> torch.Tensor:
    """A NaN buffer in NaN margins, of out's shape, for a subject that declares out_buffer."""
    from faverify.cases.margins import poisoned
    return poisoned(expected_out_shape(case), q.dtype, q.device)


def _evaluate_combine(subject: Subject, case: Case, device: torch.device, tolerance: Tolerance, clock: "_Clock",
                      in_worker: bool) -> CaseResult:
    """A split-KV combine alone: its partials are the FP64 attention over each split's keys (in fp32, as
    kernels keep them), and what it combines them into is judged against the whole attention. The baseline
    is the combine formula on the partials rounded to the case's dtype."""
    from faverify.cases.splits import combine
    from faverify.judge.sequences import split_yardsticks
    name, conventions = subject.name, subject.caps.conventions
    x = make_inputs(case, device)
    clock.lap("inputs")
    with torch.no_grad():
        parts, _, _, _ = split_yardsticks(case, x, conventions, subject.caps.split_block)
    shape = _split_shape(case)
    outs = parts["out"].reshape(shape[0]).float()
    lses = parts["lse"].reshape(shape[1]).float()
    given = (outs.clone(), lses.clone())
    try:
        with _subject_code(in_worker, skips=True):
            result = subject.fn(outs, lses)
    except (Unsupported, ValueError, NotImplementedError) as e:
        return CaseResult(name, case, "skip", f"{type(e).__name__}: {e}")
    except SubjectRaised as e:
        return failure(name, case, "fail", f"combine raised {e}", f"error:{e.name}")
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        return failure(name, case, "fail", "a combine must return (out, lse)", "contract")
    out, lse = result
    problem = _plain("out", out) or _plain("lse", lse) or \
        _check_outputs(case, x.q, out if not isinstance(out, torch.Tensor) else out.to(x.q.dtype), lse)
    if problem:
        return failure(name, case, "fail", problem, "contract")
    failing = [(f"{n}:modified", f"modified {n} in place") for n, a, b in
               (("out_splits", outs, given[0]), ("lse_splits", lses, given[1]))
               if not torch.equal(a.nan_to_num(), b.nan_to_num())]
    clock.lap("subject")
    clock.tell("judging")
    base = combine(given[0].to(x.q.dtype), given[1], x.q.dtype)
    metrics = judge(case, x, {"out": out, "lse": lse}, tolerance, ("out", "lse"), None, conventions,
                    baseline={"out": base[0], "lse": base[1]}, lap=clock.lap)
    clock.lap("metrics")
    failing += [(f"{t}:{kind(m)}", f"{t}: {m.reason}") for t, m in metrics.items() if not m.passed]
    if failing:
        return CaseResult(name, case, "fail", "; ".join(r for _, r in failing), metrics, [s for s, _ in failing])
    return CaseResult(name, case, "pass", "", metrics)


def _split_shape(case: Case) -> tuple:
    """(out_splits', lse_splits' shape): [splits] before out's and lse's own, packed for a varlen case."""
    return (case.splits, *expected_out_shape(case)), (case.splits, *expected_lse_shape(case))


def _check_splits(case: Case, splits) -> str | None:
    want = _split_shape(case)
    for name, t, shape in zip(("out_splits", "lse_splits"), splits, want):
        if _plain(name, t):
            return _plain(name, t)
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            return f"{name} has shape {tuple(getattr(t, 'shape', ()))}, expected {shape}"
    return None


def _no_lap(phase: str) -> None:
    """judge's lap where nobody times the phases."""


def judge_splits(case: Case, x: Inputs, splits, tolerance: Tolerance, caps, lap=_no_lap) -> dict:
    """The split-KV partials, each against the FP64 attention over its split's keys (empty ones must be
    out 0, lse -inf): metrics "out_splits" and "lse_splits", judged as out and lse are. lap: as judge's."""
    from faverify.judge.sequences import split_yardsticks
    with torch.no_grad():
        ref, scales, base, empty = split_yardsticks(case, x, caps.conventions, caps.split_block)
        lap("reference")
        out, lse = splits
        if case.kind == "varlen":  # the tail cut off, as out's and lse's are
            out, lse = out[:, :case.total_q], lse[:, :, :case.total_q]
        got = {"out": out.reshape(ref["out"].shape), "lse": lse.reshape(ref["lse"].shape)}
        metrics = _judged(case, got, (ref, scales, base, empty), tolerance, ("out", "lse"), caps.conventions)
    for m in metrics.values():
        m.tensor += "_splits"
    return {m.tensor: m for m in metrics.values()}


CHECK_MEMORY_ABOVE = 256 << 20  # bytes: a smaller case is not worth asking the device how much is free


# bytes: a GPU worker hands the memory of a case that took more back to the device (gives_back); twice the
# reference's chunk of temporaries (1 GiB on a GPU), which every case's estimate counts whole
GIVE_BACK_ABOVE = 2 << 30


def gives_back(case: Case, device) -> bool:
    """Whether a GPU worker hands the memory of a case it has run back to the device: one that took more
    than GIVE_BACK_ABOVE, or drew a paged pool past 2^31 elements (emptying the cache syncs the device, not
    worth it for the many small cases). The caching allocator keeps it otherwise, and the workers beside
    this one find it taken: a 2000-case triton-paged fuzz on the H200 (6 workers, each keeping what its
    cases had taken) skipped 72 cases for memory, 0.1-29 GiB of 139 free when each was drawn."""
    device = torch.device(device)
    return device.type == "cuda" and (bool(case.kind == "paged" and case.pool)
                                      or _bytes_needed(case, device, backward=True) > GIVE_BACK_ABOVE)


def _bytes_needed(case: Case, device: torch.device, backward: bool) -> int:
    """About the device memory a case takes: its tensors, the reference's and, paged, the pools."""
    from faverify.dtypes import TORCH
    from faverify.judge.reference import bytes_needed
    itemsize = TORCH[case.dtype].itemsize
    need = bytes_needed(case.batch, case.seqlen_q, case.seqlen_k, case.nheads, case.nheads_k, case.head_dim,
                        itemsize, device.type, backward)
    if case.kind == "paged":  # the pools, k and v, twice (the inputs and their untouched copy)
        pages = case.pool or case.pages_used + 1
        need += 2 * pages * case.page_size * case.nheads_k * (case.head_dim + case.dv) * itemsize
    if case.kind == "varlen":  # the tail's tokens of q, k, v and dO, in the inputs, copies and gradients
        token = case.nheads * (case.head_dim + case.dv) + case.nheads_k * (case.head_dim + case.dv)
        need += 4 * case.tail * token * itemsize
    return need


# multiply-adds of a case's FP64 reference past which it is refused: about an hour of a CPU's FP64 (1e10 a
# second), or of an H200's (1e13)
MAX_WORK = {"cpu": 1 << 45, "cuda": 1 << 55}


def _work(case: Case) -> int:
    """The FP64 reference's multiply-adds: every row against every key, forward and backward."""
    return sum(sq * sk for sq, sk in case.sequences) * case.nheads * (case.head_dim + case.dv) * 4


def _too_big(case: Case, device: torch.device, backward: bool) -> str | None:
    """Why the case cannot fit on the device (about what it would take, against what is free), or None.
    A drawn case that does not fit is skipped with this reason; `repro` of one is exit 2."""
    work = _work(case)
    if work > MAX_WORK.get(device.type, MAX_WORK["cuda"]):
        return (f"too large for this device: its FP64 reference would take {work:.2g} multiply-adds, more than "
                f"{MAX_WORK.get(device.type, MAX_WORK['cuda']):.2g} ({device.type})")
    need = _bytes_needed(case, device, backward)
    if need <= CHECK_MEMORY_ABOVE:
        return None
    free = free_memory(device)
    if free is not None and need > free and device.type == "cuda":
        torch.cuda.empty_cache()  # what this process's allocator keeps from earlier cases is free to it
        free = free_memory(device)
    if free is None or need <= free:
        return None
    return (f"too large for this device: the case needs about {need / 2**30:.1f} GiB, "
            f"{device} has {free / 2**30:.1f} GiB free")


def free_memory(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _differences(subject: Subject, case: Case, pristine: Inputs, got: dict, backward: bool, repeat: int) -> list:
    """Run the subject again (repeat - 1 times) on fresh copies of the same inputs and compare every tensor
    bit for bit with the first run: (signature, reason) for the first run that differs."""
    from faverify.cases.inputs import lay_out
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


def _copy(x: Inputs, backward: bool) -> Inputs:
    """The inputs as they are before the subject runs. The reference and the baseline are computed from
    this copy, so a subject that changes its inputs in place cannot move the yardstick it is judged by."""
    return x.copy(dout=backward)


def _changed_inputs(x: Inputs, pristine: Inputs, writes: tuple) -> list:
    """(signature, reason) for each input the subject changed and was not declared to write
    (Capabilities.writes): ("q:modified", "modified q in place: 4096 elements"). NaN stays NaN. One host
    transfer for all four."""
    names = [n for n in ("q", "k", "v", "dout") if n not in writes and getattr(pristine, n) is not getattr(x, n)]
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


class _SubjectExited(Exception):
    """A subject called os._exit: in this process that would end faverify with the subject's exit code."""


class SubjectRaised(Exception):
    """Whatever a subject raised (an Exception, SystemExit, GeneratorExit, a BaseException of its own), carried
    out of its call: its case fails with `name` and the message, and nothing is blamed on faverify."""

    def __init__(self, error: BaseException):
        self.error, self.name = error, type(error).__name__
        super().__init__(f"{self.name}: {error}")


@contextlib.contextmanager
def _subject_code(in_worker: bool, skips: bool = False):
    """Around the subject's own code. What it raises comes out as SubjectRaised, except (with skips, around
    its forward) Unsupported, ValueError and NotImplementedError, its word that a case is not supported, and a
    KeyboardInterrupt in the user's own process (Ctrl-C stops the run; in a worker, which ignores it, the
    subject raised it). While it runs, os._exit raises instead of ending the process: run in this process
    (--no-isolate, repro, golden verify), a kernel's os._exit(0) would end faverify with exit code 0, a pass
    for nothing."""
    originals = os._exit, posix._exit

    def refuse(code=0):
        raise _SubjectExited(f"the subject called os._exit({code})")
    os._exit = posix._exit = refuse
    try:
        yield
    except (Unsupported, ValueError, NotImplementedError) as e:
        if skips:
            raise
        raise SubjectRaised(e) from e
    except KeyboardInterrupt as e:
        if not in_worker:
            raise
        raise SubjectRaised(e) from e
    except BaseException as e:
        raise SubjectRaised(e) from e
    finally:
        os._exit, posix._exit = originals


def judge(case: Case, x: Inputs, got: dict, tolerance: Tolerance, tensors: tuple, given=None,
          conventions: Conventions = DEFAULT_CONVENTIONS, baseline: dict | None = None, lap=_no_lap) -> dict:
    """Judge a subject's tensors (any of out, lse, dq, dk, dv, dsinks) for `case` against the FP64
    reference (computed here, or `given` as (reference tensors, scales), from a golden file), under the
    subject's conventions: the reference's masks align as it declares and its lse is in the declared base,
    with the declared value where a row sees no key. baseline: tensors that stand for the naive
    baseline's (a combine's). lap(phase): called as the FP64 reference ("reference") and the naive
    baseline ("baseline") are done, for a case's time per phase (a ragged case's baseline is computed with
    its reference, sequence by sequence: one phase); what follows is the metrics'."""
    q, k, v = (t.detach() for t in x.tensors())
    backward = any(got.get(t) is not None for t in ("dq", "dk", "dv"))
    dout = x.dout if backward else None
    if case.kind != "dense":
        return _judge_ragged(case, x, got, tolerance, tensors, backward, conventions, baseline, lap)
    variant = variant_of(case, x, conventions)
    empty = case.empty_rows(variant.offset)
    empty_mask = None
    if given is not None and (conventions.causal, conventions.alibi) != (DEFAULT_CONVENTIONS.causal,
                                                                         DEFAULT_CONVENTIONS.alibi):
        given = None  # a golden file holds the reference under the default masks: computed here instead
    with torch.no_grad():
        if given is None:
            ref, scales = reference(q, k, v, dout, causal=case.causal, scale=case.scale, variant=variant)
        else:
            ref, scales = given
        lap("reference")
        base = naive(q, k, v, dout, causal=case.causal, scale=case.scale, variant=variant)
        lap("baseline")
        if baseline is not None:
            base = {**base, **baseline}
        if variant.mask is not None:  # the rows the mask leaves without a key, from the reference itself
            empty_mask = (ref["lse"] == -torch.inf) if x.sinks is None else torch.zeros_like(ref["lse"],
                                                                                             dtype=torch.bool)
        if conventions != DEFAULT_CONVENTIONS:
            ref, scales, base = _declared(ref, scales, base, conventions)
        stats = error_stats(got, ref, base, scales, tensors=tensors, empty_rows=empty, empty_mask=empty_mask,
                            sinks=x.sinks is not None, empty_lse=conventions.empty_lse_value)
    metrics = judge_all(stats, case.dtype, tolerance)
    lse = metrics.get("lse")
    if lse is not None and not lse.passed and not lse.nan:
        hint = _lse_base_hint(got["lse"], ref["lse"], lse.allowed, conventions)
        if hint:
            lse.reason += f"; {hint}"
    out = metrics.get("out")
    if out is not None and out.waived and out.passed:
        _within_hull(out, got["out"], (q, k, v), case, variant)
    return metrics


def _within_hull(m, out, qkv: tuple, case: Case, variant) -> None:
    """Where the weights are not determined (a waived case) out is still a convex combination of the values
    each row sees: fail m for the elements outside their hull, past twice the floor unit of the values' size
    (the fp32 sum of the weighted values rounds too: 3 ulps past 133120 over 33 keys, sdpa-math)."""
    from faverify.dtypes import FLOOR_UNIT
    from faverify.judge.reference import value_hull
    with torch.no_grad():
        lo, hi = value_hull(*qkv, causal=case.causal, variant=variant)
        slack = 2 * FLOOR_UNIT[case.dtype] * torch.maximum(lo.abs(), hi.abs()) + FLUSHED
        got = out.detach().double()
        outside = int(((got < lo - slack) | (got > hi + slack)).sum())
    if outside:
        m.passed = False
        m.reason = (f"{outside} entries outside the least and largest values their row sees (out is a convex "
                    "combination of them, whatever the weights of this ill-conditioned case)")


def _judge_ragged(case: Case, x: Inputs, got: dict, tolerance: Tolerance, tensors: tuple, backward: bool,
                  conventions: Conventions, baseline: dict | None, lap=_no_lap) -> dict:
    """judge() of a varlen or paged case: its references sequence by sequence (sequences.py), the
    subject's varlen tensors without their tail, as one packed batch."""
    from faverify.judge.sequences import yardsticks
    with torch.no_grad():
        ref, scales, base, empty = yardsticks(case, x, backward, conventions)
        lap("reference")
        if baseline is not None:
            base = {**base, **baseline}
        if case.kind == "varlen":
            got = _unpadded(case, got)
        return _judged(case, got, (ref, scales, base, empty), tolerance, tensors, conventions)


def _judged(case: Case, got: dict, yardsticks: tuple, tolerance: Tolerance, tensors: tuple,
            conventions: Conventions) -> dict:
    """The verdict on tensors against (reference, scales, baseline, rows without a key) computed per
    sequence or per split, in the declared conventions."""
    ref, scales, base, empty = yardsticks
    if conventions != DEFAULT_CONVENTIONS:
        ref, scales, base = _declared(ref, scales, base, conventions)
    stats = error_stats(got, ref, base, scales, tensors=tensors, empty_mask=empty,
                        empty_lse=conventions.empty_lse_value)
    return judge_all(stats, case.dtype, tolerance)


def _unpadded(case: Case, got: dict) -> dict:
    """A varlen subject's tensors without the tail, as a batch of one: [1, total, ...], lse [1, h, total]."""
    total_q, total_k = case.total_q, case.total_k
    out = {}
    for name, t in got.items():
        if t is None or name == "dsinks":
            out[name] = t
        elif name == "lse":
            out[name] = t[:, :total_q].unsqueeze(0)
        else:
            out[name] = t[:total_k if name in ("dk", "dv") else total_q].unsqueeze(0)
    return out


def _declared(ref: dict, scales: dict, base: dict, conventions: Conventions) -> tuple:
    """The reference and the baseline's lse in the declared base, with the declared lse where a row sees
    no key."""
    def convert(lse):
        scaled = (lse.double() * conventions.lse_scale).to(lse.dtype)
        return torch.where(lse == -torch.inf, torch.full_like(scaled, conventions.empty_lse_value), scaled)
    ref, base, scales = dict(ref), dict(base), dict(scales)
    ref["lse"], base["lse"] = convert(ref["lse"]), convert(base["lse"])
    scales["lse"] = scales["lse"] * conventions.lse_scale
    return ref, scales, base


def _lse_base_hint(got, ref, allowed: float, conventions: Conventions) -> str:
    """Say so when a failing lse is right in the other base: the convention, not the arithmetic, is off."""
    fin = torch.isfinite(ref)
    if not fin.any():
        return ""
    other = "2" if conventions.lse_base == "e" else "e"
    into_other = (1 / math.log(2.0) if other == "2" else 1.0) / conventions.lse_scale
    err = (got.detach().double()[fin] - ref[fin] * into_other).abs().nan_to_num(nan=math.inf).amax().item()
    if err <= allowed * into_other:
        return f"lse is right in base {other}: the subject declares base {conventions.lse_base} (conventions)"
    return ""


def _as_the_caller_sees(t):
    """A CUDA output as a caller reads it: copied on the current stream, before anything synchronizes the
    device. A kernel that writes its output on a stream of its own and returns without making the caller's
    stream wait gives a caller whatever the buffer held at that moment; the device-wide synchronize the
    metrics make would otherwise hide the race."""
    return t.clone() if isinstance(t, torch.Tensor) and t.is_cuda else t


def _plain(name: str, t) -> str | None:
    """A subclass of torch.Tensor answers the judging's own operations as it likes (zeros whose subtraction
    and isnan say "equal" passed every check): faverify judges plain tensors only, and reads nothing of a
    subclass before refusing it."""
    if isinstance(t, torch.Tensor) and type(t) is not torch.Tensor:
        return (f"{name} is a {type(t).__module__}.{type(t).__qualname__}, a subclass of torch.Tensor: return "
                f"a plain tensor (faverify judges only those)")
    return None


def _on_device(name: str, t, device: torch.device) -> str | None:
    if isinstance(t, torch.Tensor) and t.device != device:
        return f"{name} is on {t.device}, expected the inputs' device {device}"
    return None


def expected_out_shape(case: Case) -> tuple:
    """out's shape: [b, s, h, head_dim_v]; a varlen case's packed [total_q + tail, h, head_dim_v]."""
    if case.kind == "varlen":
        return case.total_q + case.tail, case.nheads, case.dv
    return case.batch, case.seqlen_q, case.nheads, case.dv


def expected_lse_shape(case: Case) -> tuple:
    """lse's shape: [b, h, seqlen_q]; a varlen case's [h, total_q + tail] (flash-attn's)."""
    if case.kind == "varlen":
        return case.nheads, case.total_q + case.tail
    return case.batch, case.nheads, case.seqlen_q


def _check_outputs(case: Case, q: torch.Tensor, out, lse) -> str | None:
    """The calling convention (docs/design.md): out like q, on q's device, lse [b, h, seqlen_q] float32
    (varlen: packed, expected_out_shape)."""
    if not isinstance(out, torch.Tensor):
        return f"out is {type(out).__name__}, expected a tensor"
    problem = _plain("out", out) or _plain("lse", lse) or _on_device("out", out, q.device) \
        or _on_device("lse", lse, q.device)
    if problem:
        return problem
    want_out = expected_out_shape(case)
    if tuple(out.shape) != want_out:
        layout = "[total_q + tail, h, head_dim_v]" if case.kind == "varlen" else "[b, s, h, head_dim_v]"
        return f"out has shape {tuple(out.shape)}, expected {want_out} ({layout})"
    if out.dtype != q.dtype:
        return f"out has dtype {out.dtype}, expected the input dtype {q.dtype}"
    if lse is not None:
        want = expected_lse_shape(case)
        if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != want:
            layout = "[h, total_q + tail]" if case.kind == "varlen" else "[b, h, seqlen_q]"
            return f"lse has shape {tuple(getattr(lse, 'shape', ()))}, expected {want} ({layout})"
        if lse.dtype != torch.float32:
            return f"lse has dtype {lse.dtype}, expected torch.float32"
    return None
