import dataclasses

import pytest
import torch

from faverify.cases.case import Case
from faverify.run.gradcheck import directional
from faverify.subjects import resolve
from faverify.subjects.base import Capabilities, Subject
from property_tests.planted import correct


class _WrongDk(torch.autograd.Function):
    """Right forward, backward that forgets the softmax scale in dk."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        with torch.enable_grad():
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            out = correct(qq, kk, vv, causal=False, softmax_scale=scale)
        ctx.save_for_backward(qq, kk, vv, out)
        ctx.scale = scale
        return out.detach()

    @staticmethod
    def backward(ctx, dout):
        qq, kk, vv, out = ctx.saved_tensors
        dq, dk, dv = torch.autograd.grad(out, (qq, kk, vv), dout)
        return dq, dk / ctx.scale, dv, None


def wrong_dk(q, k, v, *, causal, softmax_scale):
    return _WrongDk.apply(q, k, v, q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale)


class _Off(torch.autograd.Function):
    """Right forward, every gradient `factor` times its value."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, factor):
        with torch.enable_grad():
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            out = correct(qq, kk, vv, causal=causal, softmax_scale=scale)
        ctx.save_for_backward(qq, kk, vv, out)
        ctx.factor = factor
        return out.detach()

    @staticmethod
    def backward(ctx, dout):
        qq, kk, vv, out = ctx.saved_tensors
        return (*(g * ctx.factor for g in torch.autograd.grad(out, (qq, kk, vv), dout)), None, None, None)


def one_percent_off(q, k, v, *, causal, softmax_scale):
    return _Off.apply(q, k, v, causal, softmax_scale, 1.01)


def fifth_off(q, k, v, *, causal, softmax_scale):
    return _Off.apply(q, k, v, causal, softmax_scale, 1.2)


# the two cases the default sdpa-math fuzz failed on (softcap 0.05-0.0625 at scale 2: tanh bends within one
# step of the difference quotient), and ordinary ones of several sizes
STEEP = ('{"batch":1,"seqlen_q":256,"seqlen_k":256,"nheads":4,"nheads_k":2,"head_dim":120,"dtype":"bf16",'
         '"softmax_scale":2.0,"regime":"peaked","layout":"broadcast","seed":1702,"softcap":0.05,"alibi":"head",'
         '"head_dim_v":1}',
         '{"batch":1,"seqlen_q":1,"seqlen_k":256,"nheads":2,"nheads_k":2,"head_dim":120,"dtype":"bf16",'
         '"softmax_scale":2.0,"seed":0,"softcap":0.0625,"head_dim_v":1}')
ORDINARY = (Case(1, 16, 16, 1, 1, 16, seed=1), Case(2, 65, 129, 4, 2, 64, causal=True, seed=7),
            Case(1, 200, 256, 2, 1, 128, softmax_scale=2.0, seed=3))


@pytest.mark.parametrize("text", STEEP)
def test_a_steep_softcap_passes_where_the_quotient_cannot_resolve_the_derivative(text):
    """A correct subject passes: the FP64 reference's own quotient error along the same step and direction is
    allowed (twice), after the step shrank as far as it goes."""
    g = directional(resolve("sdpa-math"), Case.from_json(text), torch.device("cpu"))
    assert g.passed and not g.skipped and g.truncation > 1e-3 and g.step < 2.0 ** -10, (g.reason, g.truncation)


@pytest.mark.parametrize("case", ORDINARY, ids=lambda c: c.short())
def test_a_backward_one_percent_off_fails_the_check(case):
    """The direction is the sign of the subject's own gradient, so a backward off by a factor shows its whole
    error, whatever the size of the case; the correct subject passes the same cases."""
    s = Subject("one-percent-off", one_percent_off, Capabilities.of())
    g = directional(s, case, torch.device("cpu"))
    assert not g.passed and "directional derivative" in g.reason, (g.rel_err, g.allowed)
    assert 0.009 < g.rel_err < 0.011, g.rel_err
    right = directional(Subject("correct", correct, Capabilities.of()), case, torch.device("cpu"))
    assert right.passed and right.rel_err < right.allowed / 4, (right.rel_err, right.allowed)


def test_directional_derivative_agrees_for_a_correct_backward():
    g = directional(resolve("sdpa-math"), Case(1, 33, 17, 2, 1, 32, causal=True, seed=4), torch.device("cpu"))
    assert g.passed and not g.skipped and g.dtype == "fp32" and g.rel_err < 1e-4


def test_directional_derivative_catches_a_backward_that_is_not_the_forward_s():
    s = Subject("wrong-dk", wrong_dk, Capabilities.of())
    g = directional(s, Case(1, 16, 16, 1, 1, 16, seed=1), torch.device("cpu"))
    assert not g.passed and "directional derivative" in g.reason


def test_low_precision_subjects_are_checked_in_their_widest_dtype():
    s = Subject("fp16-only", correct, Capabilities.of(dtypes=("bf16", "fp16")))
    g = directional(s, Case(1, 16, 24, 2, 2, 32, seed=2), torch.device("cpu"))
    assert g.dtype == "fp16" and g.passed, g.reason
    b = directional(Subject("bf16-only", correct, Capabilities.of(dtypes=("bf16",))), Case(1, 16, 24, 2, 2, 32, seed=2),
                    torch.device("cpu"))
    assert b.dtype == "bf16" and b.passed, b.reason


def test_variant_cases_are_checked_with_their_slopes_and_sinks():
    """The check calls the subject with the case's ALiBi slopes and sinks, as the case itself does; the
    sinks' own gradient is judged with the others (dsinks), not here."""
    g = directional(resolve("sdpa-math"), Case(1, 20, 30, 2, 2, 16, window=(4, 2), softcap=3.0, alibi="head",
                                               sinks="around", seed=5), torch.device("cpu"))
    assert g.passed and not g.skipped, g.reason


def test_a_sink_above_every_logit_is_checked_around_the_rows_lse_where_fp32_flushes_its_weights():
    """Under a sink far above the logits each key's weight is near fp32's smallest normal or under it, and a
    GPU flushes those terms to zero: the H200's fuzz failed triton's check on such a case (-5.58e-35 against
    -5.45e-35, relative 0.00225; b3 sq3 sk1088 h8/1 d21 fp16 causal scale=2 sinks=above dv=256) whose
    gradients were right against FP64. The CPU flushes them too with flush_denormal: with the sink kept
    above, this case's check is off by 0.48 there (-2.87e-35); around the rows' lse it passes."""
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals (torch.set_flush_denormal)")
    try:
        case = Case(1, 3, 1088, 8, 1, 21, dtype="fp16", causal=True, softmax_scale=3.0, sinks="above",
                    head_dim_v=256, seed=1)
        g = directional(resolve("sdpa-math"), case, torch.device("cpu"))
    finally:
        torch.set_flush_denormal(False)
    assert g.passed and not g.skipped and g.rel_err < 1e-4, g.reason


def test_a_forward_without_an_autograd_graph_is_skipped_not_a_crash():
    def detached(q, k, v, *, causal, softmax_scale):
        return correct(q, k, v, causal=causal, softmax_scale=softmax_scale).detach()
    g = directional(Subject("detached", detached, Capabilities.of()), Case(1, 8, 8, 1, 1, 16), torch.device("cpu"))
    assert g.skipped and "no autograd graph" in g.reason


def test_a_subject_that_raises_in_the_checks_dtype_fails_the_check_not_the_worker():
    """A kernel that passes in the case's dtype but raises in the check's (flex on the H200: no Triton
    config fits the shared memory in fp32 at head dim 192) is a failing check with the subject's message
    and a signature of its own, as a forward that raises is, not an exception out of the case."""
    from faverify.run.evaluate import evaluate

    def fp32_out_of_resources(q, k, v, *, causal, softmax_scale):
        if q.dtype == torch.float32:
            raise RuntimeError("No valid triton configs: out of resource")
        return correct(q, k, v, causal=causal, softmax_scale=softmax_scale)
    s = Subject("no-fp32-kernel", fp32_out_of_resources, Capabilities.of())
    r = evaluate(s, Case(1, 16, 16, 1, 1, 16, dtype="bf16", seed=1), torch.device("cpu"), gradcheck=True)
    assert r.status == "fail" and r.signatures == ["gradcheck:error:RuntimeError"], (r.status, r.signatures)
    assert "fp32: the subject raised RuntimeError: No valid triton configs" in r.reason, r.reason
    assert r.gradcheck["error"] == "RuntimeError" and not r.gradcheck["passed"]


# the case the H200's fuzz of the Hopper backward failed its fp16 check on (854 against 933) while every
# gradient passed against FP64: a single query row at scale 2, whose softmax bends within the longest step
PEAKED_ROW = Case(1, 1, 33, 1, 1, 48, softmax_scale=2.0, seed=1)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_a_correct_low_precision_subject_passes_where_the_step_rounds_and_the_forward_rounds(dtype):
    """At the shorter steps x +- h e is not exact for |x| past 2^p h (fp16: 2 at h/16), and the forward's
    rounding over 2h outgrows the dtype's allowance: the quotient is compared with the gradient along the
    step it took, and a correct forward's rounding (the naive baseline's at both ends) is allowed. Without
    those, 46 of these 300 seeds failed the correct subject in fp16."""
    s = Subject(f"{dtype}-only", correct, Capabilities.of(dtypes=(dtype,)))
    checks = [directional(s, dataclasses.replace(PEAKED_ROW, seed=seed), torch.device("cpu")) for seed in range(300)]
    assert all(g.passed and not g.skipped for g in checks), [g.reason for g in checks if not g.passed][:3]
    h = {"fp16": 2.0**-6, "bf16": 2.0**-5}[dtype]
    assert {g.step for g in checks} == {h, h / 4, h / 16}  # every step was the best-resolved on some seed
    assert any(g.rounding > 0.01 for g in checks)


def test_the_forwards_rounding_allowance_leaves_a_fifth_off_backward_caught():
    """The allowance for the forward's rounding is the smallest over the steps: a backward 20% off, where
    fp16 resolves the quotient worst (a single peaked row), still fails most seeds."""
    s = Subject("fifth-off", fifth_off, Capabilities.of(dtypes=("fp16",)))
    caught = sum(not directional(s, dataclasses.replace(PEAKED_ROW, seed=seed), torch.device("cpu")).passed
                 for seed in range(40))
    assert caught >= 24, caught


def test_the_row_of_checks_names_the_closest_check_and_how_close_it_came():
    """Each check's allowance adds its own truncation and rounding: the table's row reports the check that
    came closest to its allowance, not the largest error beside some other check's allowance."""
    from faverify.reports.collector import KernelStats
    stats = KernelStats("k")
    stats.gradchecks["fp32"] += [dict(rel_err=8e-4, allowed=4e-3, passed=True),  # the largest error, far within
                                 dict(rel_err=9e-4 / 2, allowed=1e-3, passed=True)]  # the closest, at 0.45
    row = stats.gradcheck_rows()[0]
    assert row["rel_err_max"] == 8e-4 and row["allowed"] == 1e-3 and row["usage_max"] == pytest.approx(0.45)
