"""Sparse key indices (cases/sparse.py): the reference reads them as the libraries do, each planted bug
of a sparse kernel is caught with a minimal case that has them, and each control passes."""

import pytest

from faverify.cases.case import Case
from faverify.errors import UsageError
from faverify.run.evaluate import evaluate
from faverify.subjects import resolve
from faverify.subjects.base import Capabilities, Subject
from property_tests.cli_helpers import cli, planted_bug_caught

PLANTED = "property_tests.planted_sparse"


@pytest.mark.parametrize("bug,signature", [("minus_one_as_zero", "out:"), ("nan_on_empty", "out:nan")])
def test_a_planted_bug_of_a_sparse_kernel_is_caught_and_the_controls_pass(bug, signature, tmp_path):
    record, mine, args = planted_bug_caught(f"{PLANTED}:{bug}", "sparse", 150, tmp_path,
                                            lambda s: s.startswith(signature))
    minimal = Case.from_dict(mine[0]["minimal"]["case"])
    assert minimal.sparse is not None and record["summary"]["by_feature"]["sparse"]["failed"] > 0, minimal
    for control in ("gather_correct", "mask_correct"):
        r = cli("fuzz", "--kernel", f"{PLANTED}:{control}", *args)
        assert r.exit_code == 0, r.stdout[-2000:]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_key_listed_twice_weighs_as_the_subject_declares(dtype):
    """A gathering kernel weighs a duplicate twice, a masking one once: each passes under its own
    convention and fails under the other's, in bf16 too, where a weight taken as a bias rounds most."""
    case = Case.of(1, 6, 5, 2, 1, 16, dtype=dtype, sparse="duplicates", topk=8, seed=3)
    for name, other in (("gather_correct", {"sparse_duplicates": "once"}), ("mask_correct", "flash-attn-3")):
        declared = resolve(f"{PLANTED}:{name}")
        swapped = Subject(name, declared.fn, Capabilities.of(**{**declared.caps.to_dict(), "conventions": other}))
        assert evaluate(declared, case, "cpu", mode="fwd").status == "pass"
        assert evaluate(swapped, case, "cpu", mode="fwd").status == "fail"


def test_sdpa_math_runs_the_sparse_cases_forward_and_backward(tmp_path):
    r = cli("fuzz", "--kernel", "sdpa-math", "--iters", "40", "--device", "cpu", "--no-db", "--no-isolate",
            "--features", "sparse,sinks", "--json", tmp_path / "run.json")
    assert r.exit_code == 0, r.stdout[-2000:]
    summary = __import__("json").loads((tmp_path / "run.json").read_text())["kernels"][0]["summary"]
    assert summary["by_feature"]["sparse"]["cases"] >= 10, summary["by_feature"]


def test_duplicate_weights_rounded_as_a_bias_in_fp16_pass():
    """SDPA takes a key's multiplicity as an additive bias log n in the inputs' dtype, rounded there: torch's
    math backend, correct, errs by 1.76 times the naive baseline on this case (keys listed about 28 times)."""
    case = Case.of(1, 128, 2, 4, 4, 64, dtype="fp16", regime="constant", sparse="duplicates", topk=56, seed=236181066)
    r = evaluate(resolve("sdpa-math"), case, "cpu")
    assert r.status == "pass", r.reason


@pytest.mark.parametrize("change,rule", [(dict(causal=True), "no causal mask"), (dict(topk=0), "topk"),
                                         (dict(topk=65), "topk"), (dict(sparse="all"), "must be one of")])
def test_a_sparse_case_that_means_nothing_is_refused(change, rule):
    case = Case.of(1, 4, 5, 1, 1, 16, sparse="distinct", topk=2)
    with pytest.raises(UsageError, match=rule):
        case.replace(**change)


def test_the_max_logit_of_a_key_listed_twice_is_its_logit_not_its_weight():
    """A key listed twice weighs twice in the softmax (log 2 on its logit, for "each"), but its logit is its
    own: the reference's max logit is the largest scaled q.k among the listed keys."""
    import torch

    from faverify.cases.inputs import make_inputs, variant_of
    from faverify.judge.reference import reference
    case = Case.of(1, 3, 6, 2, 1, 16, dtype="fp32", sparse="duplicates", topk=8, max_logit=True, seed=41)
    x = make_inputs(case, "cpu")
    ref, _ = reference(*x.tensors(), causal=False, scale=case.scale, variant=variant_of(case, x), max_logit=True)
    q, k = x.q.double(), x.k.double()
    for i in range(case.seqlen_q):
        keys = sorted({int(j) for j in x.indices[0, i, 0]})
        for h in range(case.nheads):
            want = max(float(q[0, i, h] @ k[0, j, 0]) * case.scale for j in keys)
            assert ref["max_logit"][0, h, i].item() == pytest.approx(want, rel=1e-12)
    counts = torch.stack([torch.bincount(r.long(), minlength=6) for r in x.indices[0, :, 0]])
    assert bool((counts > 1).any())  # the case lists some key twice
