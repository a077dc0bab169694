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
    from faverify.cases.case import Case
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


@settings(max_examples=12)
@given(cases(limits=CPU_LIMITS, dtypes=("fp32",), features=("window", "softcap", "alibi", "sinks", "head_dim_v")))
def test_variant_cases_in_a_users_suite(case):
    """The strategies draw the features; the extras and dsinks go through the same assertion."""
    import torch

    from property_tests.planted import variant_correct
    x = make_inputs(case, "cpu", requires_grad=True)
    kwargs = dict(x.extras())
    if case.window != (-1, -1):
        kwargs["window_size"] = case.window
    if case.softcap:
        kwargs["softcap"] = case.softcap
    out, lse = variant_correct(x.q, x.k, x.v, causal=case.causal, softmax_scale=case.scale, **kwargs)
    wrt = x.differentiable()  # q, k, v and the sinks where they are learned (not the off-by-one sink)
    grads = torch.autograd.grad(out, tuple(wrt.values()), x.dout)
    got = dict(zip(wrt, grads), out=out, lse=lse)
    assert set(assert_attention_close(got, case)) == set(got)


def test_conventions_in_a_users_suite():
    from faverify.cases.case import Case
    from property_tests.planted import lse_base2
    case = Case(1, 8, 8, 2, 2, 16, dtype="fp32")
    x = make_inputs(case, "cpu")
    out = lse_base2(x.q, x.k, x.v, causal=False, softmax_scale=None)
    assert_attention_close(out, case, conventions="flashinfer")
    with pytest.raises(AssertionError, match="lse is right in base 2"):
        assert_attention_close(out, case)


def readme_snippet() -> str:
    """The code of the README's "In your tests", as it stands there."""
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = text.split("\n## In your tests\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.+?)```", section, re.S).group(1)


@pytest.mark.slow
@pytest.mark.parametrize("kernel, passes", [("correct", True), ("top_left_mask", False)])
def test_the_readme_snippet_runs_verbatim_under_plain_pytest(tmp_path, kernel, passes):
    """Copied into a test file of its own, beside a package mypkg.attn whose my_attention is a planted
    subject, and run by plain pytest in a fresh process: no conftest of this project (whose profile has no
    deadline), the default Hypothesis settings, this machine's device."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "attn.py").write_text(f"from property_tests.planted import {kernel} as my_attention\n")
    (tmp_path / "test_snippet.py").write_text(readme_snippet())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "HYPOTHESIS"))}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(root)])
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                        "test_snippet.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == (0 if passes else 1), r.stdout[-3000:] + r.stderr[-2000:]
    assert ("1 passed" if passes else "attention output is not close to the FP64 reference") in r.stdout, r.stdout
