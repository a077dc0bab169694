"""The flash-attn-4 and flashinfer adapters (faverify/subjects/flash_attn_4.py, flashinfer.py): where their
package does not import, a clear error; where it does, each case translated into the library's vocabulary.
The translation is checked on the CPU with stand-ins that keep the libraries' calling conventions
(property_tests/fake_libraries.py) and judged against FP64 by the verdict, as a GPU fuzz would judge the
libraries themselves; a stand-in off by one convention (lse in the wrong base) must fail there."""
import dataclasses
import math
import sys

import pytest

from faverify.cases.case import Case
from faverify.errors import EnvironmentProblem
from faverify.run.evaluate import evaluate
from faverify.subjects import resolve
from property_tests import fake_libraries


def _on_cpu(subject):
    """The subject declared for the CPU too: the stand-ins run anywhere."""
    return dataclasses.replace(subject, caps=dataclasses.replace(subject.caps, devices=("cpu", "cuda")))


@pytest.fixture
def fake_fa4(monkeypatch):
    calls = []
    package = type(sys)("flash_attn")
    package.cute = fake_libraries.flash_attn_cute(calls)
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", package.cute)
    return calls


@pytest.fixture
def fake_flashinfer(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "flashinfer", fake_libraries.flashinfer(calls))
    return calls


@pytest.fixture(params=[2, 3])
def fake_fa23(request, monkeypatch):
    """flash-attn 2's flash_attn package or flash-attn 3's flash_attn_interface: (subject name, calls)."""
    calls = []
    module = fake_libraries.flash_attn_2_and_3(calls, request.param)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return ("flash-attn" if request.param == 2 else "flash-attn-3"), calls


@pytest.mark.parametrize("name,module", [("flash-attn-4", "flash_attn"), ("flashinfer", "flashinfer"),
                                         ("flash-attn", "flash_attn"), ("flash-attn-3", "flash_attn_interface")])
def test_an_adapter_whose_package_does_not_import_says_so(name, module, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    with pytest.raises(EnvironmentProblem) as e:
        resolve(name)
    assert name in str(e.value) and "does not import here" in str(e.value)


FA4_CASES = {
    "dense-causal-gqa": Case(2, 37, 53, 4, 2, 64, dtype="bf16", causal=True, seed=1),
    "window-both": Case(1, 90, 70, 2, 1, 32, dtype="fp16", window=(9, 4), seed=2),
    "window-left-causal": Case(1, 64, 64, 2, 2, 64, dtype="bf16", causal=True, window=(5, -1), seed=3),
    "softcap-sinks": Case(1, 40, 41, 2, 1, 64, dtype="bf16", softcap=3.0, sinks="around", seed=4),
    "head-dim-v": Case(1, 20, 30, 2, 2, 64, dtype="bf16", head_dim_v=32, seed=5),
    "varlen": Case.of(3, 30, 40, 2, 1, 64, dtype="bf16", seqlens=((30, 40), (0, 5), (12, 3)), causal=True, seed=6),
    "paged": Case.of(2, 3, 45, 2, 1, 64, dtype="bf16", cache_seqlens=(45, 13), page_size=8, pages="random", seed=7),
}


@pytest.mark.parametrize("name", list(FA4_CASES))
def test_flash_attn_4_cases_translate_to_its_calls_and_pass_against_fp64(name, fake_fa4):
    case = FA4_CASES[name]
    r = evaluate(_on_cpu(resolve("flash-attn-4")), case, "cpu", mode="fwd")
    assert r.status == "pass", (r.status, r.reason)
    call = fake_fa4[-1]
    assert call["kind"] == case.kind if case.kind in ("varlen", "paged") else call["kind"] == "dense"
    assert call["window_size"] == tuple(None if w < 0 else w for w in case.window)


def test_flash_attn_4_skips_a_head_dim_it_does_not_take(fake_fa4):
    r = evaluate(_on_cpu(resolve("flash-attn-4")), Case(1, 8, 8, 1, 1, 36, dtype="bf16"), "cpu", mode="fwd")
    assert r.status == "skip" and "multiples of 8" in r.reason, r.reason
    assert not fake_fa4


def test_flash_attn_4_skips_the_backward_of_gqa_with_unlike_head_dims_and_runs_its_forward(fake_fa4):
    """flash_bwd_sm90 asserts head_dim == head_dim_v under GQA: such a case is skipped with the reason when
    it will be differentiated, and its forward alone still runs; without GQA the backward runs."""
    gqa = Case(1, 20, 30, 4, 2, 64, dtype="bf16", head_dim_v=32, seed=5)
    r = evaluate(_on_cpu(resolve("flash-attn-4")), gqa, "cpu", mode="both")
    assert r.status == "skip" and "GQA only with head_dim == head_dim_v" in r.reason, r.reason
    assert evaluate(_on_cpu(resolve("flash-attn-4")), gqa, "cpu", mode="fwd").status == "pass"
    same_heads = dataclasses.replace(gqa, nheads_k=4)
    r = evaluate(_on_cpu(resolve("flash-attn-4")), same_heads, "cpu", mode="both")
    assert r.status == "pass", (r.status, r.reason)


def test_flash_attn_4_skips_a_paged_case_whose_head_dims_are_not_multiples_of_16(fake_fa4):
    case = FA4_CASES["paged"]
    for d, dv in ((72, 72), (64, 40)):
        r = evaluate(_on_cpu(resolve("flash-attn-4")), dataclasses.replace(case, head_dim=d, head_dim_v=dv), "cpu",
                     mode="fwd")
        assert r.status == "skip" and "multiples of 16" in r.reason, r.reason
    assert not fake_fa4
    dense = case.replace(cache_seqlens=None, page_size=0, pages="in-order", head_dim=72)
    assert evaluate(_on_cpu(resolve("flash-attn-4")), dense, "cpu", mode="fwd").status == "pass"


def test_flash_attn_4_names_its_wheels_version_and_draws_head_dims_it_takes(fake_fa4, monkeypatch):
    from importlib import metadata
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "4.0.0b36" if name == "flash-attn-4" else real(name))
    subject = resolve("flash-attn-4")
    assert "flash-attn 4 (4.0.0b36)" in subject.description, subject.description
    assert subject.caps.draw() == {"head_dim_multiple": 8, "max_head_dim_v": 256}
    from property_tests.cli_helpers import cli
    row = next(line for line in cli("kernels").stdout.splitlines() if line.startswith("flash-attn-4 "))
    assert " 8..256 x8 " in row and "flash-attn 4 (4.0.0b36)" in row, row


FLASHINFER_CASES = {
    "dense-causal-gqa": Case(2, 37, 53, 4, 2, 64, dtype="bf16", causal=True, seed=1),
    "window-left": Case(1, 90, 70, 2, 1, 128, dtype="fp16", window=(9, -1), seed=2),
    "window-left-causal": Case(1, 64, 64, 2, 2, 64, dtype="bf16", causal=True, window=(5, 3), seed=3),
    "softcap": Case(1, 40, 41, 2, 1, 64, dtype="bf16", softcap=3.0, seed=4),
    "varlen": Case.of(3, 30, 40, 2, 1, 64, dtype="bf16", seqlens=((30, 40), (2, 5), (12, 3)), causal=True, seed=6),
    "varlen-tail-window": Case.of(2, 30, 40, 4, 2, 128, dtype="fp16", seqlens=((30, 40), (7, 25)), tail=5,
                                  window=(6, -1), softcap=4.0, seed=8),
    "paged-prefill": Case.of(2, 3, 45, 2, 1, 64, dtype="bf16", cache_seqlens=(45, 13), page_size=8, pages="random",
                             causal=True, seed=7),
    "paged-decode": Case.of(3, 1, 40, 8, 2, 128, dtype="bf16", cache_seqlens=(40, 1, 17), page_size=16,
                            pages="random", window=(9, -1), seed=9),
}
FLASHINFER_API = {"varlen": "batch prefill ragged", "paged": "batch prefill paged", "dense": "single prefill"}


@pytest.mark.parametrize("name", list(FLASHINFER_CASES))
def test_flashinfer_cases_translate_to_its_calls_and_pass_against_fp64(name, fake_flashinfer):
    """Each kind of case through the API a serving engine calls for it (a paged cache with one query token
    a request through the decode wrapper), its outputs judged against FP64."""
    case = FLASHINFER_CASES[name]
    r = evaluate(_on_cpu(resolve("flashinfer")), case, "cpu", mode="fwd")
    assert r.status == "pass", (r.status, r.reason)
    api = "batch decode paged" if case.kind == "paged" and case.seqlen_q == 1 else FLASHINFER_API[case.kind]
    assert fake_flashinfer[-1]["api"] == api and r.paths == [api], (fake_flashinfer[-1]["api"], r.paths)
    assert fake_flashinfer[-1]["window_left"] == case.window[0]


def test_flashinfer_skips_what_it_cannot_express(fake_flashinfer):
    subject = _on_cpu(resolve("flashinfer"))
    right = evaluate(subject, Case(1, 16, 16, 1, 1, 64, dtype="bf16", window=(4, 2)), "cpu", mode="fwd")
    odd = evaluate(subject, Case(1, 16, 16, 1, 1, 96, dtype="bf16"), "cpu", mode="fwd")
    empty = evaluate(subject, Case.of(2, 1, 20, 2, 1, 64, dtype="bf16", cache_seqlens=(20, 0), page_size=4), "cpu",
                     mode="fwd")
    assert right.status == "skip" and "right bound (2) without causal" in right.reason, right.reason
    assert odd.status == "skip" and "q/k 96, v 96: takes only 64, 128, 256" in odd.reason, odd.reason
    assert empty.status == "skip" and "empty cache" in empty.reason, empty.reason


def test_a_flashinfer_fuzz_draws_only_the_head_dims_its_kernels_are_built_for(fake_flashinfer):
    """FlashInfer compiles its kernels for head dims 64, 128 and 256: a fuzz draws those alone, every
    feature it declares beside them (drawn from the default head dims, all 37 cases a 400-case fuzz on the
    H200 reached were skipped)."""
    import torch
    from hypothesis import given, settings

    from faverify.cases.strategies import cases
    CUDA = torch.device("cuda")
    caps = resolve("flashinfer").caps
    assert caps.draw() == {"head_dims": (64, 128, 256), "exact_head_dims": True}
    from property_tests.cli_helpers import cli
    row = next(line for line in cli("kernels").stdout.splitlines() if line.startswith("flashinfer "))
    assert " 64,128,256 " in row, row

    @settings(max_examples=60, deadline=None, database=None)
    @given(cases(dtypes=caps.dtypes, features=caps.features(), **caps.draw()))
    def check(case):
        assert case.head_dim in (64, 128, 256) and case.dv == case.head_dim, case
        assert "head dim" not in (caps.reason_unsupported(case, CUDA) or "")
    check()


def test_a_flashinfer_lse_in_the_wrong_base_fails(monkeypatch):
    """The verdict reads FlashInfer's lse in base 2 (conventions preset 'flashinfer'): a library returning
    natural logs under that preset is a failure of lse, not a pass."""
    monkeypatch.setitem(sys.modules, "flashinfer", fake_libraries.flashinfer([], lse_base=math.e))
    r = evaluate(_on_cpu(resolve("flashinfer")), Case(1, 16, 20, 2, 1, 64, dtype="bf16", seed=3), "cpu", mode="fwd")
    assert r.status == "fail" and "lse" in r.reason, (r.status, r.reason)



FA23_CASES = {
    "dense-causal-gqa": Case(2, 37, 53, 4, 2, 64, dtype="bf16", causal=True, seed=1),
    "rows-without-keys": Case(1, 40, 17, 2, 1, 64, dtype="fp16", causal=True, seed=2),  # lse +inf in FA2
    "window-softcap": Case(1, 64, 70, 2, 2, 64, dtype="bf16", window=(5, 3), softcap=4.0, seed=3),
    "alibi": Case(2, 20, 30, 4, 2, 32, dtype="bf16", alibi="batch-head", causal=True, seed=4),
    "varlen": Case.of(3, 30, 40, 2, 1, 64, dtype="bf16", seqlens=((30, 40), (0, 5), (12, 3)), tail=3, causal=True,
                      seed=6),
    "paged": Case.of(2, 3, 300, 2, 1, 64, dtype="bf16", cache_seqlens=(300, 13), page_size=256, pages="random", seed=7),
}
FA23_API = {"dense": "func", "varlen": "varlen", "paged": "with_kvcache"}


@pytest.mark.parametrize("name", list(FA23_CASES))
def test_flash_attn_2_and_3_cases_translate_and_pass_against_fp64(name, fake_fa23):
    """Each kind of case through flash-attn's function for it, forward and backward where it has one, and
    lse read by the version's conventions (flash-attn 2's +inf on rows that see no key); ALiBi is flash-attn
    2's only (skipped on 3, with the reason)."""
    subject_name, calls = fake_fa23
    case = FA23_CASES[name]
    r = evaluate(_on_cpu(resolve(subject_name)), case, "cpu")
    if case.alibi != "off" and subject_name == "flash-attn-3":
        assert r.status == "skip" and "alibi" in r.reason, (r.status, r.reason)
        return
    assert r.status == "pass", (r.status, r.reason)
    assert calls[-1]["api"] == FA23_API[case.kind] and r.paths and r.paths[0].startswith(FA23_API[case.kind])
    assert ("dq" in r.metrics) == (case.kind != "paged")  # with_kvcache has no backward


def test_flash_attn_2_s_lse_convention_is_what_the_verdict_reads(monkeypatch):
    """Read under flash-attn 3's conventions, flash-attn 2's +inf lse on a row that sees no key fails: the
    preset is what makes it pass, not a loose verdict."""
    module = fake_libraries.flash_attn_2_and_3([], 2)
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    subject = _on_cpu(resolve("flash-attn"))
    wrong = dataclasses.replace(subject, caps=dataclasses.replace(subject.caps, conventions="flash-attn-3"))
    r = evaluate(wrong, FA23_CASES["rows-without-keys"], "cpu", mode="fwd")
    assert r.status == "fail" and "lse" in r.reason, (r.status, r.reason)


def test_flash_attn_skips_what_it_cannot_take(fake_fa23):
    subject_name, calls = fake_fa23
    subject = _on_cpu(resolve(subject_name))
    dv = evaluate(subject, Case(1, 8, 8, 1, 1, 64, dtype="bf16", head_dim_v=32), "cpu", mode="fwd")
    assert dv.status == "skip" and "head_dim_v" in dv.reason, dv.reason
    small_page = evaluate(subject, Case.of(1, 1, 20, 2, 1, 64, dtype="bf16", cache_seqlens=(20,), page_size=16), "cpu",
                          mode="fwd")
    if subject_name == "flash-attn":
        assert small_page.status == "skip" and "page" in small_page.reason, small_page.reason
    else:
        assert small_page.status == "pass", small_page.reason
    odd = evaluate(subject, Case(1, 8, 8, 1, 1, 36, dtype="bf16"), "cpu", mode="fwd")
    assert (odd.status == "skip" and "multiples of 8" in odd.reason) if subject_name == "flash-attn-3" else \
        odd.status == "pass", (odd.status, odd.reason)
