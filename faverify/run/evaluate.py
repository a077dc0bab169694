"""Evaluate one case on one subject: inputs -> subject -> FP64 reference and baseline -> metrics -> verdict.

evaluate() never raises for anything the subject does: an unsupported case is a skip with the reason,
any other exception in the subject is a failing case with its message. Only our own bugs propagate.
"""
from __future__ import annotations

import dataclasses
import time

import torch

from faverify.cases.case import Case
from faverify.cases.inputs import Inputs, lay_out, make_inputs
from faverify.cases.margins import written_outside
from faverify.cases.ragged import tail_gradients
from faverify.cases.splits import combine
from faverify.errors import Unsupported
from faverify.judge.judging import judge, judge_splits
from faverify.judge.sequences import split_yardsticks
from faverify.judge.verdict import Tolerance, kind
from faverify.reports.case_result import CaseResult, failure
from faverify.run.contract import (
    SENTINEL,
    as_the_caller_sees,
    check_max_logit,
    check_outputs,
    check_splits,
    on_device,
    out_buffer,
    plain,
    split_shape,
    unwritten,
)
from faverify.run.gradcheck import directional
from faverify.run.guard import SubjectRaised, subject_code
from faverify.run.memory import gives_back, too_big
from faverify.run.relations import RELATION_CHECKS
from faverify.run.side_effects import changed_inputs, copy_inputs, differences
from faverify.subjects.base import Subject

MODES = {"fwd": ("out", "lse", "max_logit"), "bwd": ("dq", "dk", "dv", "dsinks", "dbias"),
         "both": ("out", "lse", "max_logit", "dq", "dk", "dv", "dsinks", "dbias")}


def evaluate(subject: Subject, case: Case, device: torch.device | str, *, mode: str = "both",
             tolerance: Tolerance | None = None, gradcheck: bool = False, stored=None,
             in_worker: bool = False, repeat: int = 1, tell=None, measure: tuple = (),
             keep: dict | None = None) -> CaseResult:
    """tell(phase): called with "judging" once the subject's own calls of the case are done and faverify's
    judging begins, and with "subject" before the gradient check calls it again (a worker tells its parent,
    whose timeout is the subject's alone: isolation.py).
    stored: (inputs, reference, scales) from a golden file instead of drawing from the seed and
    computing the reference here (golden.py). in_worker: this process is a worker (isolation.py), where
    Ctrl-C is ignored, so a KeyboardInterrupt is the subject's own and fails its case; in the user's
    process it stops the run. repeat: run the subject that many times on the same inputs; a case whose
    outputs differ in any bit fails as "nondeterministic". measure: relations (run/relations.py) checked and
    recorded beside those the subject promises, failing nothing. keep: a dict that gets the subject's tensors
    as "got" and, for a dense case, the reference's as "reference" (`repro --plot`)."""
    device = torch.device(device)
    tolerance = tolerance or Tolerance()
    if case.before:
        return _sequence(subject, case, device, dict(mode=mode, tolerance=tolerance, gradcheck=gradcheck,
                                                     in_worker=in_worker, repeat=repeat, tell=tell, measure=measure))
    start = time.perf_counter()
    clock = _Clock(device, tell)
    subject.take()  # whatever ran (or compiled: a warm-up) before this case is not its
    relations: dict = {}  # the records _evaluate leaves, relation by relation
    result = _evaluate(subject, case, device, mode, tolerance, clock, stored, in_worker, repeat, relations, measure,
                       keep)
    result.relations = relations
    if gives_back(case, device):
        torch.cuda.empty_cache()
    taken = subject.take()
    result.paths, result.compiles = list(taken.paths), taken.compiles
    if subject.compile_key is not None:
        result.compile_keys = [repr(k) for k in subject.compile_key(case, device.type)]
    compiling = taken.compile_seconds
    if compiling:  # the compiler's time (or the JIT cache's), not the kernel's: phases of their own
        clock.laps.update(compiling)
        clock.laps["subject"] = max(0.0, clock.laps.get("subject", 0.0) - sum(compiling.values()))
    # where the FP64 reference cannot judge the gradients (an ill-conditioned case waives them), the check of
    # the backward against the subject's own forward does: a zero backward fails it there too
    waived = any(m.waived for t, m in result.metrics.items() if t in MODES["bwd"])
    if (gradcheck or waived) and result.status == "pass":
        clock.tell("subject")
        result.gradcheck = directional(subject, case, device).to_dict()
        clock.lap("gradcheck")
        # what the check's own calls compiled (its fp32 and fp64 configurations) is the check's time, not the
        # case's compiles: those count the configurations of the case's own calls (Subject.compile_key)
        subject.take()
        if not result.gradcheck["passed"] and not result.gradcheck["skipped"]:
            result.status = "fail"
            result.reason = "gradient check: " + result.gradcheck["reason"]
            error = result.gradcheck.get("error")
            result.signatures = [f"gradcheck:error:{error}" if error else "gradcheck"]
    result.seconds = time.perf_counter() - start
    result.phases = clock.laps
    result.device = str(device)
    return result


def _sequence(subject: Subject, case: Case, device: torch.device, settings: dict) -> CaseResult:
    """A call sequence, in this process: each call judged in turn, each with a timeout of its own. The first
    that fails is the result, its case the sequence cut after it (a failure of the calls before the last is
    theirs); else the last call's, as the whole sequence. The phases are the calls' together."""
    calls = case.before + (dataclasses.replace(case, before=()),)
    phases: dict = {}
    seconds, compiles, keys = 0.0, 0, []
    for i, call in enumerate(calls):
        if i and settings["tell"]:
            settings["tell"]("subject")  # the subject's time again: the next call's
        last = i == len(calls) - 1
        r = evaluate(subject, call, device, **{**settings, "gradcheck": settings["gradcheck"] and last})
        seconds, compiles, keys = seconds + r.seconds, compiles + r.compiles, keys + r.compile_keys
        for phase, t in r.phases.items():
            phases[phase] = phases.get(phase, 0.0) + t
        if r.failed or r.status == "error" or last:
            r.case = dataclasses.replace(call, before=case.before[:i])
            r.phases, r.seconds, r.compiles, r.compile_keys = phases, seconds, compiles, list(dict.fromkeys(keys))
            return r
    raise AssertionError("unreachable: the last call returns")


def exercise(subject: Subject, case: Case, device: torch.device | str, mode: str = "both") -> None:
    """Run the subject on a case without judging it (forward, and backward unless mode is fwd): the fuzz
    warm-up, which only wants what the case compiles. The subject's exceptions propagate."""
    device = torch.device(device)
    if subject.unsupported(case, device) is not None:
        return
    x = make_inputs(case, device, requires_grad=mode != "fwd")
    out, _ = subject(x.q, x.k, x.v, case, x.extras())
    if mode != "fwd" and subject.caps.backward_on(torch.device(device).type) and out.requires_grad:
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
              clock: _Clock, stored, in_worker: bool, repeat: int = 1, relations: dict | None = None,
              measure: tuple = (), keep: dict | None = None) -> CaseResult:
    """in_worker: a KeyboardInterrupt in the subject is its own (evaluate says why). Whatever the subject
    raises fails its case (subject_code); what faverify's own code raises propagates."""
    name = subject.name
    reason, mode, backward, judged_on_less = _what_runs(subject, case, device, mode)
    if reason:
        return CaseResult(name, case, "skip", reason)
    if subject.caps.ragged.combine:
        return _evaluate_combine(subject, case, device, tolerance, clock, in_worker)

    try:
        if stored is None:
            x, reference_given = make_inputs(case, device, requires_grad=backward), None
        else:
            x, reference_given = lay_out(case, stored[0], requires_grad=backward), stored[1:]
        pristine = copy_inputs(x, backward)
    except (MemoryError, torch.OutOfMemoryError) as e:  # faverify's side: workers beside this one took it
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
        return CaseResult(name, case, "skip", f"out of memory making the inputs ({type(e).__name__})")
    buffer = out_buffer(case, x.q) if subject.caps.out_buffer else None
    clock.lap("inputs")
    try:
        with subject_code(in_worker, skips=True):
            out, lse, splits, max_logit = subject.call(x.q, x.k, x.v, case, x.extras(), out=buffer)
    except (Unsupported, ValueError, NotImplementedError) as e:
        return CaseResult(name, case, "skip", f"{type(e).__name__}: {e}")
    except SubjectRaised as e:  # the subject's failure, recorded with its message
        return failure(name, case, "fail", f"forward raised {e}", f"error:{e.name}")
    problem = check_outputs(case, x.q, out, lse) or (check_splits(case, splits) if splits is not None else None)
    if problem is None and subject.caps.lse and lse is None:
        problem = "the subject declares lse: true but returned out alone (return (out, lse))"
    if problem is None and case.max_logit:
        problem = check_max_logit(case, x.q, max_logit, subject.caps.conventions.max_logit)
    if problem:
        return failure(name, case, "fail", problem, "contract")

    graphless = backward and not out.requires_grad
    out, lse = as_the_caller_sees(out), as_the_caller_sees(lse)
    got = {"out": out, "lse": lse, "max_logit": as_the_caller_sees(max_logit)}
    if graphless:  # the gradients asked for are zero through an out without a graph: judged as such
        got.update({g: torch.zeros_like(t) for g, t in x.differentiable().items()})
    elif backward:
        stopped = _gradients(subject, case, x, pristine, out, got, in_worker)
        if stopped is not None:
            return stopped
    failing = changed_inputs(x, pristine, subject.caps.writes)
    if backward:
        failing += tail_gradients(case, got, subject.caps.ragged.tail_grads)
    if buffer is not None:
        failing += _buffer_checks(subject, case, pristine, buffer, out, in_worker)
    if relations is not None and (subject.caps.relations or measure):
        failing += _relations(subject, case, pristine, got, backward, in_worker, relations, measure)
    clock.lap("subject")
    if repeat > 1:
        try:
            with subject_code(in_worker):
                failing += differences(subject, case, pristine, got, backward, repeat)
        except SubjectRaised as e:
            failing.append((f"error:{e.name}", f"a repeated run raised {e}"))
        clock.lap("repeat")
    clock.tell("judging")
    try:
        metrics = judge(case, pristine, got, tolerance, MODES[mode], reference_given, subject.caps.conventions,
                        lap=clock.lap, keep=keep)
        if keep is not None:
            keep["got"] = got
        if splits is not None:
            metrics.update(judge_splits(case, pristine, splits, tolerance, subject.caps, lap=clock.lap))
    except (MemoryError, torch.OutOfMemoryError) as e:  # faverify's side ran out, not the subject's
        return CaseResult(name, case, "skip", f"out of memory computing the FP64 reference ({type(e).__name__})")
    clock.lap("metrics")
    failing += [(f"{t}:{kind(m)}", f"{t}: {m.reason}") for t, m in metrics.items() if not m.passed]
    if failing and graphless:
        failing.insert(0, ("contract", NO_GRAPH))
    if failing:
        return CaseResult(name, case, "fail", "; ".join(r for _, r in failing), metrics, [sig for sig, _ in failing])
    return CaseResult(name, case, "pass", judged_on_less, metrics)


def _buffer_checks(subject: Subject, case: Case, pristine: Inputs, buffer, out, in_worker: bool) -> list:
    """A subject that writes into the out buffer it is given: nothing written outside its rows, and every
    element of them written. The second is seen by a second call into a buffer filled with SENTINEL:
    an element NaN after the first call and SENTINEL after the second was never written."""
    rows = case.total_q if case.kind == "varlen" else buffer.shape[0]
    failing = []
    written = written_outside(buffer, rows)
    if written:
        failing.append(("out:written-outside", f"wrote {written} elements of the out buffer outside the "
                                              "sequences' tokens (its tail or its margins)"))
    again = copy_inputs(pristine, False)
    second = out_buffer(case, again.q).fill_(SENTINEL)
    try:
        with subject_code(in_worker), torch.no_grad():
            subject.call(again.q, again.k, again.v, case, again.extras(), out=second)
    except SubjectRaised as e:
        return failing + [(f"error:{e.name}", f"a second call into a filled out buffer raised {e}")]
    missed = unwritten(case, as_the_caller_sees(out).detach(), as_the_caller_sees(second), rows)
    return failing + ([("out:unwritten", missed)] if missed else [])


def _relations(subject: Subject, case: Case, pristine: Inputs, got: dict, backward: bool, in_worker: bool,
               relations: dict, measure: tuple) -> list:
    """The relations the subject promises and those asked to be measured: their records in `relations`; a
    promised one broken is a failing signature."""
    failing = []
    for name in dict.fromkeys(subject.caps.relations + tuple(measure)):
        promised = name in subject.caps.relations
        try:
            with subject_code(in_worker):
                found = relations[name] = {**RELATION_CHECKS[name](subject, case, pristine, got, backward),
                                           "promised": promised}
        except SubjectRaised as e:
            if promised:
                failing.append((f"error:{e.name}", f"the {name} relation's call raised {e}"))
            continue
        if promised and found["checked"] and not found["equal"]:
            failing.append((f"relation:{name}", f"the {name} relation is broken: {found['where']} differs, by up "
                                                f"to {found['max_diff']:.3g} of its largest value"))
    return failing

def _what_runs(subject: Subject, case: Case, device: torch.device, mode: str) -> tuple:
    """(why the case is skipped or None, the mode it runs in, whether its backward runs, why a case asked
    for its backward is judged on its forward alone or "")."""
    reason = subject.unsupported(case, device)
    backward = mode != "fwd" and not subject.caps.ragged.combine  # a combine has no gradients to ask
    if reason is None and mode == "bwd" and subject.caps.ragged.combine:
        reason = "a split-KV combine has no backward"
    judged_on_less = ""
    for forward_only, why in ((case.kind == "paged", PAGED_FORWARD), (case.fp8 is not None, FP8_FORWARD)):
        if reason is None and forward_only and backward:
            if mode == "bwd":
                reason = why
            mode, backward, judged_on_less = "fwd", False, "forward only: " + why
    if reason is None and backward and not subject.caps.backward_on(device.type):
        if mode == "bwd":
            reason = NO_BACKWARD if not subject.caps.backward else f"the subject has no backward on {device.type}"
        mode, backward, judged_on_less = "fwd", False, (
            NO_BACKWARD_ONLY if not subject.caps.backward else f"forward only: no backward on {device.type}")
    if reason is None:
        reason = too_big(case, device, backward)
    return reason, mode, backward, judged_on_less


def _gradients(subject: Subject, case: Case, x: Inputs, pristine: Inputs, out, got: dict,
               in_worker: bool) -> CaseResult | None:
    """The subject's backward through autograd, its gradients put in `got` as the caller sees them; the
    failing result if it raised or returned gradients no caller could use, else None."""
    name = subject.name
    outputs, output_grads = (out,), (x.dout,)
    if case.lse_grad != "off":  # a loss on lse too: the subject's lse must carry its gradient
        lse = got["lse"]
        if lse is None or not lse.requires_grad:
            return failure(name, case, "fail", "the subject declares lse_grad but its lse has no autograd graph: "
                           "a loss on lse would give no gradient", "contract")
        outputs, output_grads = (out, lse), (x.dout, x.dlse.to(lse.dtype))
    try:
        with subject_code(in_worker):
            wrt = x.differentiable()
            grads = torch.autograd.grad(outputs, tuple(wrt.values()), output_grads, allow_unused=True)
    except SubjectRaised as e:  # autograd's own complaint may come from an input changed in place
        failing = changed_inputs(x, pristine, subject.caps.writes)
        failing.append((f"error:{e.name}", f"backward raised {e}"))
        return CaseResult(name, case, "fail", "; ".join(r for _, r in failing), signatures=[s for s, _ in failing])
    names = tuple(wrt)
    for gname, grad, inp in zip(names, grads, wrt.values()):
        got[gname] = grad if grad is not None else torch.zeros_like(inp)
    problem = next((p for g in names if (p := plain(g, got[g]) or on_device(g, got[g], x.q.device))), None)
    if problem:
        return failure(name, case, "fail", problem, "contract")
    got.update({g: as_the_caller_sees(got[g]) for g in names})
    return None


# why a case whose out has no autograd graph fails where its gradients are not zero
NO_GRAPH = ("out has no autograd graph, so its gradients were taken as zero: return out with its graph, or "
            "declare backward: false (or the devices it runs on, backward_devices)")
PAGED_FORWARD = "paged cases are judged on the forward (decode kernels are forward-only)"
FP8_FORWARD = "FP8 cases are judged on the forward (the FP8 kernels people ship are forward-only)"
NO_BACKWARD = "the subject declares no backward (backward: false): judge it with --mode fwd"
NO_BACKWARD_ONLY = "forward only: the subject declares no backward (backward: false)"


def _evaluate_combine(subject: Subject, case: Case, device: torch.device, tolerance: Tolerance, clock: "_Clock",
                      in_worker: bool) -> CaseResult:
    """A split-KV combine alone: its partials are the FP64 attention over each split's keys (in fp32, as
    kernels keep them), and what it combines them into is judged against the whole attention. The baseline
    is the combine formula on the partials rounded to the case's dtype."""
    name, conventions = subject.name, subject.caps.conventions
    x = make_inputs(case, device)
    clock.lap("inputs")
    with torch.no_grad():
        parts, _, _, _ = split_yardsticks(case, x, conventions, subject.caps.ragged.split_block)
    shape = split_shape(case)
    outs = parts["out"].reshape(shape[0]).float()
    lses = parts["lse"].reshape(shape[1]).float()
    given = (outs.clone(), lses.clone())
    try:
        with subject_code(in_worker, skips=True):
            result = subject.fn(outs, lses)
    except (Unsupported, ValueError, NotImplementedError) as e:
        return CaseResult(name, case, "skip", f"{type(e).__name__}: {e}")
    except SubjectRaised as e:
        return failure(name, case, "fail", f"combine raised {e}", f"error:{e.name}")
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        return failure(name, case, "fail", "a combine must return (out, lse)", "contract")
    out, lse = result
    problem = plain("out", out) or plain("lse", lse) or \
        check_outputs(case, x.q, out if not isinstance(out, torch.Tensor) else out.to(x.q.dtype), lse)
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


