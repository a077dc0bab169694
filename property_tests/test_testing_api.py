import pytest
from hypothesis import given, settings

from faverify.testing import CPU_LIMITS, assert_attention_close, cases, make_inputs
from property_tests.planted import correct, top_left_mask, with_lse


@settings(max_examples=15)
@given(cases(limits=CPU_LIMITS))
def test_a_correct_kernel_passes_in_a_users_suite(case):
    x = make_inputs(case, "cpu", requires_grad=True)
    out = correct(x.q, x.k, x.v, causal=case.causal, softmax_scale=case.scale)
    import torch
    dq, dk, dv = torch.autograd.grad(out, (x.q, x.k, x.v), x.dout)
    metrics = assert_attention_close({"out": out, "dq": dq, "dk": dk, "dv": dv}, case)
    assert set(metrics) == {"out", "dq", "dk", "dv"}


def test_a_wrong_kernel_fails_with_table_and_reproducer():
    from faverify.case import Case
    case = Case(1, 1, 2, 1, 1, 16, causal=True)
    x = make_inputs(case, "cpu")
    with pytest.raises(AssertionError) as e:
        assert_attention_close(top_left_mask(x.q, x.k, x.v, causal=True, softmax_scale=case.scale), case,
                               kernel="property_tests.planted:top_left_mask")
    message = str(e.value)
    assert "max error" in message and "worst index" in message
    assert "faverify repro --kernel property_tests.planted:top_left_mask" in message
    with pytest.raises(AssertionError, match="lse"):
        assert_attention_close(with_lse(x.q, x.k, x.v, causal=True, softmax_scale=case.scale), case)
