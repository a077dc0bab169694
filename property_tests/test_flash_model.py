"""The tolerance models the flash algorithm's own roundings (judge/flash_bound.py, docs/design.md "The flash
algorithm's own roundings"): correct flash kernels that round otherwise than the naive attention pass, and
kernels a few parts in a thousand off still fail.

The subject of most of these tests is property_tests/flash_emulation.py: FlashAttention-2 in plain torch,
its backward's S summed in another order than its forward's."""
import pytest

from faverify.cases.case import Case
from faverify.run.evaluate import evaluate
from faverify.subjects import resolve
from property_tests.cli_helpers import cli, read_json

EMULATION = "property_tests.flash_emulation"
# each a correct kernel's case that failed before the model had the rounding it shows
SOFTCAP_SATURATED = Case.from_json('{"batch":2,"seqlen_q":33,"seqlen_k":1,"nheads":1,"nheads_k":1,"head_dim":16,'
                                   '"dtype":"fp32","causal":true,"regime":"large","seed":70,"softcap":30.0,'
                                   '"sinks":"above"}')
S_RECOMPUTED = Case.from_json('{"batch":2,"seqlen_q":2,"seqlen_k":19,"nheads":2,"nheads_k":1,"head_dim":40,'
                              '"dtype":"fp32","causal":false,"softmax_scale":2.0,"regime":"peaked",'
                              '"layout":"contiguous","init":"-inf","seed":1}')
S_RECOMPUTED_D128 = Case(2, 2, 19, 2, 1, 128, dtype="fp32", regime="peaked", softmax_scale=2.0, seed=5)
LONE_KEY = Case(2, 1, 1, 1, 1, 32, dtype="bf16", regime="lone-key", seed=28)


@pytest.mark.parametrize("subject, case", [
    ("property_tests.planted:variant_correct", SOFTCAP_SATURATED),  # torch autograd: 1 - tanh^2 at tanh = 1
    (f"{EMULATION}:control", SOFTCAP_SATURATED),
    (f"{EMULATION}:control", LONE_KEY),  # P of the only key from exponents near -7e5 in log2 units
    (f"{EMULATION}:control", S_RECOMPUTED_D128),  # the dominant key's s - m an ulp of s, not 0
    (f"{EMULATION}:control", S_RECOMPUTED),
    ("triton", S_RECOMPUTED),  # failed on a CPU whose BLAS summed the backward's S otherwise
])
def test_a_correct_flash_kernel_that_rounds_otherwise_passes(subject, case):
    r = evaluate(resolve(subject), case, "cpu")
    assert r.status == "pass", r.reason


def test_the_flash_term_is_what_lets_them_pass(monkeypatch):
    """Without it (E_T = 0) the saturated softcap's dq, the lone key's dv and the recomputed S's dv fail: the
    term is the model of the rounding, not slack added elsewhere."""
    from faverify.judge import verdict
    judge = verdict.judge_tensor

    def without_flash(stats, *args, **kwargs):
        import dataclasses
        return judge(dataclasses.replace(stats, flash=0.0), *args, **kwargs)
    monkeypatch.setattr(verdict, "judge_tensor", without_flash)
    assert "dq:tolerance" in evaluate(resolve(f"{EMULATION}:control"), SOFTCAP_SATURATED, "cpu").signatures
    assert "dv:tolerance" in evaluate(resolve(f"{EMULATION}:control"), LONE_KEY, "cpu").signatures
    assert "dv:tolerance" in evaluate(resolve(f"{EMULATION}:control"), S_RECOMPUTED_D128, "cpu").signatures


def test_where_the_reference_cannot_judge_the_gradients_the_gradient_check_does():
    """Every element 133120: fp32 cannot determine the logits, so the FP64 reference waives the gradients.
    The weights a kernel takes there are its own: torch's math backend gives one key of 33 none, where every
    key holds the same vector (its tail block's sum rounds otherwise), and passes. The gradient check judges
    the backward against the subject's own forward on every such case: zero gradients fail it, the flash
    emulation (P from its row max and sum, or from its lse) passes."""
    case = Case.from_json('{"batch":1,"seqlen_q":1,"seqlen_k":33,"nheads":1,"nheads_k":1,"head_dim":23,'
                          '"dtype":"bf16","causal":false,"regime":"bf16-scale","seed":0}')
    assert evaluate(resolve("sdpa-math"), case, "cpu").status == "pass"
    for dtype in ("bf16", "fp16", "fp32"):
        case = Case(1, 48, 32, 2, 1, 32, dtype=dtype, causal=True, regime="bf16-scale", seed=1)
        zero = evaluate(resolve("property_tests.planted_gradients:zero_gradients"), case, "cpu")
        assert zero.signatures == ["gradcheck"] and zero.metrics["dv"].waived, (dtype, zero.reason)
        for subject in ("control", "control_p_from_lse"):
            r = evaluate(resolve(f"{EMULATION}:{subject}"), case, "cpu")
            assert r.status == "pass" and r.gradcheck["passed"], (dtype, subject, r.reason)


@pytest.mark.parametrize("subject", ["control", "d_off", "l_not_rescaled", "k_scaled_in_dtype"])
def test_bugs_of_a_few_parts_in_a_thousand_fail_where_the_control_passes(subject, tmp_path):
    """The same 30 cases (seed 0, every dtype, both modes): the control passes; D off by 2^-10, l not rescaled
    when the row max moves, and Triton's tutorial K scaled into the input dtype each fail."""
    r = cli("fuzz", "--kernel", f"{EMULATION}:{subject}", "--iters", "30", "--seed", "0", "--dtype", "bf16,fp16,fp32",
            "--device", "cpu", "--no-db", "--shrink-budget", "4", "--json", tmp_path / "run.json")
    failed = read_json(tmp_path / "run.json")["kernels"][0]["summary"]["failed"]
    if subject == "control":
        assert r.exit_code == 0 and failed == 0, r.stderr
    else:
        assert r.exit_code == 1 and failed > 0, r.stderr

