"""The judge fails every wrong output a careless comparator lets through (subjects/controls.py), on every
dtype, among them the regimes whose outputs are tiny or whose tolerance is widest; doctor says so."""
import pytest

from faverify.judge.verdict import Tolerance
from faverify.run.evaluate import evaluate
from faverify.subjects import controls, resolve


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("name", list(controls.CONTROLS))
def test_every_control_fails_every_case_of_every_dtype(name, dtype):
    drawn = controls.cases(dtype, name)
    assert len(drawn) >= 5
    passed = [(c.short(), r.status, r.reason[:80]) for c in drawn
              if (r := evaluate(controls.subject(name), c, "cpu", mode="fwd")).status != "fail"]
    assert passed == []


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_correct_kernel_passes_the_controls_cases(dtype):
    """The cases are ones a correct kernel passes: what fails there is the control's, not the case's."""
    right = resolve("sdpa-math")
    assert [c.short() for c in controls.cases(dtype) if evaluate(right, c, "cpu", mode="fwd").status != "pass"] == []


def test_doctor_fails_a_tolerance_that_lets_a_control_through():
    from faverify.commands.doctor import _judge_check
    assert _judge_check("quick", Tolerance()).status == "Pass"
    # a floor of a million roundings: every output within it passes, zeros among them
    loose = Tolerance(atol={t: 1e6 for t in ("out", "lse", "dq", "dk", "dv", "dsinks", "dbias")})
    check = _judge_check("quick", loose)
    assert check.status == "Fail" and "zeros pass" in check.detail, check.detail
